// The rule that packs documents into rows of seq_len token slots (packing with document masking,
// issue 31), in one place: the data loader lays its rows out with it, and `tokenize --chat` uses it to
// print the fill rate a run will see. A document longer than seq_len is cut into pieces of seq_len
// (the last one shorter); pieces go, in order, into the current row when they fit in what is left of
// it, else into a new row (the old row's tail is padding). one_per_row: every piece opens a new row
// (the padded mode, --packing=one-per-row).
#pragma once

#include <algorithm>
#include <cstdint>

namespace qtrain {

class RowPacker {
public:
    RowPacker(int seq_len, bool one_per_row) : seq_len_(seq_len), one_per_row_(one_per_row), used_(seq_len) {}

    // Places a document of `length` tokens: place(offset, piece_length, new_row) for each piece, offset
    // within the document; new_row says the piece opens a row. Returns whether the document was split.
    template <class Place>
    bool add(int64_t length, Place&& place) {
        for (int64_t offset = 0; offset < length; offset += seq_len_) {
            const int64_t piece = std::min<int64_t>(seq_len_, length - offset);
            const bool new_row = used_ + piece > seq_len_ || (one_per_row_ && used_ > 0);
            if (new_row) {
                used_ = 0;
                ++rows_;
            }
            place(offset, piece, new_row);
            used_ += piece;
            tokens_ += piece;
        }
        return length > seq_len_;
    }

    int64_t rows() const { return rows_; }
    int64_t tokens() const { return tokens_; }
    // document tokens / row slots
    double fill_rate() const { return rows_ ? static_cast<double>(tokens_) / (static_cast<double>(rows_) * seq_len_) : 0.0; }

private:
    int seq_len_;
    bool one_per_row_;
    int64_t used_;  // slots taken in the current row (full at first: the first piece opens a row)
    int64_t rows_ = 0, tokens_ = 0;
};

}  // namespace qtrain
