// The parts of the extension qtrain._qtrain, each in its own file (module.cpp puts them together).
#pragma once

#include <nanobind/nanobind.h>

namespace qtrain::python {

void bind_session(nanobind::module_& m);  // session_bindings.cpp: Session, memory_plan
void bind_data(nanobind::module_& m);     // data_bindings.cpp: DataLoader, write_tokens

}  // namespace qtrain::python
