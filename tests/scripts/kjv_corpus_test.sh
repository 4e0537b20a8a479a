#!/usr/bin/env bash
# ctest KjvCorpus: scripts/kjv_corpus.sh gives the demo's corpus as 66 documents, one per book:
# Genesis first and whole, and each document starting exactly at a book's first verse. The book
# starts are found independently of the script: they are the verses numbered 1:1.
#   tests/scripts/kjv_corpus_test.sh SOURCE_DIR   (exit 77 = skipped: no `bible`)
set -euo pipefail
src="${1:?usage: kjv_corpus_test.sh SOURCE_DIR}"
command -v bible >/dev/null || { echo "skipped: no 'bible' command (Debian package bible-kjv)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$src/scripts/kjv_corpus.sh" "$tmp/kjv.txt"
bible -f 'gen1:1-rev22:21' > "$tmp/verses.txt"
verses=$(wc -l < "$tmp/verses.txt")

docs=$(awk 'BEGIN { RS = "" } END { print NR }' "$tmp/kjv.txt")
[ "$docs" -eq 66 ] || fail "$docs documents, expected 66 (one per book)"
blank=$(grep -c '^$' "$tmp/kjv.txt" || true)
[ "$blank" -eq 65 ] || fail "$blank blank lines, expected 65 (one between books)"
lines=$(wc -l < "$tmp/kjv.txt")
[ "$lines" -eq $((verses + 65)) ] || fail "$lines lines, expected $verses verses + 65 separators"

# Each document's first line is the next verse numbered 1:1 (the reference removed).
grep -E '^[1-3]?[A-Za-z]+1:1 ' "$tmp/verses.txt" | cut -d' ' -f2- > "$tmp/book_starts.txt"
[ "$(wc -l < "$tmp/book_starts.txt")" -eq 66 ] || fail "bible lists $(wc -l < "$tmp/book_starts.txt") verses 1:1, expected 66"
awk 'BEGIN { RS = ""; FS = "\n" } { print $1 }' "$tmp/kjv.txt" > "$tmp/doc_starts.txt"
diff "$tmp/book_starts.txt" "$tmp/doc_starts.txt" >&2 || fail "documents do not start at the books' first verses"

# The first document is Genesis, all of it and nothing else.
genesis=$(bible -f 'gen1:1-gen50:26' | wc -l)
first=$(awk 'BEGIN { RS = ""; FS = "\n" } NR == 1 { print NF }' "$tmp/kjv.txt")
[ "$first" -eq "$genesis" ] || fail "the first document has $first verses, Genesis has $genesis"
head -n1 "$tmp/kjv.txt" | grep -qx 'In the beginning God created the heaven and the earth.' || fail "does not start with Genesis 1:1"
echo "ok: 66 books, $verses verses, Genesis first ($genesis verses)"
