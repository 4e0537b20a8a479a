// Small file-system helpers with errors that name the path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qtrain {

std::string read_text_file(const std::string& path);
std::vector<uint8_t> read_binary_file(const std::string& path);
// Writes via a temporary file in the same directory and renames it over `path`, so readers never
// see a half-written file.
void write_file_atomic(const std::string& path, const void* data, std::size_t size);
void write_text_file_atomic(const std::string& path, const std::string& text);
// Expands a shell glob (~, *, ?, [..], {a,b}); results sorted. A pattern without wildcards is
// returned as-is if the file exists. Throws naming `what` (e.g. "--train-file") if nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern, const std::string& what);
// "1.50 GiB"-style formatting.
std::string human_bytes(uint64_t bytes);
// Parses "24GiB", "512MiB", "1.5GB", "1000000" into bytes; `what` names the flag on error.
uint64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace qtrain
