#!/usr/bin/env bash
# Writes the King James Bible (Debian's bible-kjv package, offline) as plain text to OUT: one
# document per book, 66 in canonical order (Genesis first), a blank line between books, the verse
# references removed — what `tokenize --doc-separator=blank-line` cuts into 66 documents.
#   scripts/kjv_corpus.sh OUT
# `bible` prints one verse per line after its reference ("Ge1:1", "1Sm3:4", "SSol2:1"); the book
# is the reference without its trailing chapter:verse, so the digit of "1Sm" and "2Sm" stays part
# of the name and 1 and 2 Samuel remain two books.
set -euo pipefail
out="${1:?usage: scripts/kjv_corpus.sh OUT}"
command -v bible >/dev/null || { echo "kjv_corpus.sh: no 'bible' command (Debian package bible-kjv; scripts/setup.sh installs it)" >&2; exit 1; }
bible -f 'gen1:1-rev22:21' | awk '
  { book = $1; sub(/[0-9]+:[0-9]+$/, "", book)
    if (NR > 1 && book != prev) print ""
    prev = book; $1 = ""; sub(/^ /, ""); print }' > "$out.tmp"
mv "$out.tmp" "$out"
