#include "model/flag_names.h"

#include <mutex>
#include <stdexcept>
#include <utility>

namespace qtrain {

namespace {

// A few dozen entries, looked up only to write a message: a list is enough.
struct Registry {
    std::mutex mutex;
    std::vector<std::pair<ModelFlag, std::string>> names;

    const std::string* find(const ModelFlag& key) {
        for (const auto& [k, name] : names)
            if (k == key) return &name;
        return nullptr;
    }
};

Registry& registry() {
    static Registry r;
    return r;
}

}  // namespace

void register_flag_name(const ModelFlag& key, const std::string& name) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (const std::string* known = r.find(key)) {
        if (*known != name)
            throw std::logic_error("flag names: one model field registered as " + *known + " and as " + name);
        return;
    }
    r.names.emplace_back(key, name);
}

std::string flag(const ModelFlag& key) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (const std::string* name = r.find(key)) return *name;
    throw std::logic_error(
        "flag names: a model message names a field that no option-table entry registered (src/train/option_table.cpp "
        "registers them when the table is built; the entry needs its .model or .names)");
}

bool has_flag_name(const ModelFlag& key) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    return r.find(key) != nullptr;
}

}  // namespace qtrain
