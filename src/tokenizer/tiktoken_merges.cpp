#include "tokenizer/tiktoken_merges.h"

#include <string_view>
#include <unordered_map>

#include "core/error.h"

namespace qtrain {

std::vector<RankMerge> merges_from_ranks(const BpeModel& ranks, const std::string& source) {
    std::unordered_map<std::string_view, int32_t> id_of;
    id_of.reserve(static_cast<std::size_t>(ranks.size()));
    for (int32_t id = 0; id < ranks.size(); ++id) id_of.emplace(ranks.token(id), id);

    std::vector<RankMerge> merges;
    std::vector<std::string_view> parts;  // adjacent views into the token: joining two is one wider view
    for (int32_t rank = 0; rank < ranks.size(); ++rank) {
        const std::string& token = ranks.token(rank);
        if (token.size() < 2) continue;
        parts.clear();
        for (std::size_t i = 0; i < token.size(); ++i) parts.emplace_back(token.data() + i, 1);
        // tiktoken's loop, restricted to ranks below this token's: lowest rank first, leftmost on ties
        while (parts.size() > 2) {
            int32_t best_rank = rank;
            std::size_t best = parts.size();
            for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
                const auto found = id_of.find(std::string_view(parts[i].data(), parts[i].size() + parts[i + 1].size()));
                if (found != id_of.end() && found->second < best_rank) {
                    best_rank = found->second;
                    best = i;
                }
            }
            if (best == parts.size()) break;
            parts[best] = std::string_view(parts[best].data(), parts[best].size() + parts[best + 1].size());
            parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
        }
        QT_CHECK(parts.size() == 2, source, ": token ", rank, " (", token.size(),
                 " bytes) is not reached by BPE over the lower ranks (it stops at ", parts.size(),
                 " parts), so no tokenizer.json merges list can produce it");
        merges.push_back({id_of.at(parts[0]), id_of.at(parts[1]), rank});
    }
    return merges;
}

}  // namespace qtrain
