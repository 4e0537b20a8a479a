#include "core/error.h"

namespace qtrain {

void throw_error(const std::string& message) { throw Error(message); }

}  // namespace qtrain
