#include "io/flat_layout.h"

#include "core/checksum.h"
#include "core/error.h"

namespace qtrain {

void FlatLayout::check(const std::string& what) const {
    int64_t end = 0;
    for (const FlatTensor& t : tensors) {
        QT_CHECK(t.offset >= end, what, ": tensor '", t.name, "' at element ", t.offset,
                 " overlaps the one before it or is out of offset order (that one ends at ", end, ")");
        end = t.offset + t.numel();
    }
    QT_CHECK(end <= total, what, ": the tensors end at element ", end, ", beyond the layout's total of ", total);
}

std::string FlatLayout::fingerprint() const {
    std::string text;
    for (const FlatTensor& t : tensors) {
        text += t.name + "@" + std::to_string(t.offset) + ":";
        for (int64_t d : t.shape) text += std::to_string(d) + ",";
        text += ";";
    }
    text += "total=" + std::to_string(total);
    return checksum_hex(checksum_bytes(text.data(), text.size()));
}

const char* flat_array_name(FlatArray a) {
    switch (a) {
        case FlatArray::Master: return "master";
        case FlatArray::ExpAvg: return "exp_avg";
        case FlatArray::ExpAvgSq: return "exp_avg_sq";
    }
    return "?";
}

}  // namespace qtrain
