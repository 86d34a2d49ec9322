// The bad-input table of docs/errors.md, as tests see it: every row of that table is a test, and
// every test of a bad input is a row. Each tests/<layer>/bad_input_*_test.cc holds the rows of
// one category (ids CLI-, JOB-, DEV-, CLU-, PLAN-, CKPT-, DATA-), runs each as its own test, and
// checks with expectRowsDocumented() that docs/errors.md lists exactly those rows with the same
// error type, message excerpt and exit code, so the table cannot drift from what the code does.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/core/error.h"
#include "chorus_version.h"

namespace chorus::testing {

// The type column of a row the command-line parser (CLI11) refuses before any chorus code runs:
// it prints its own line, without a type, and exits 2.
constexpr const char* kUsage = "usage";

// One bad input, as documented.
struct BadInputRow {
  std::string id;       // "JOB-07": the row's id in docs/errors.md
  std::string type;     // chorus::Error::kind() of the error, or kUsage
  std::string excerpt;  // a part of the message the user sees, verbatim
  int exit_code = -1;   // what `chorus` exits with; -1 = the exit code of `type`
};

// Names the tests of a parameterized suite whose parameters hold a BadInputRow `row` after their
// rows: "JOB_07".
template <typename Param>
std::string rowName(const ::testing::TestParamInfo<Param>& info) {
  std::string name = info.param.row.id;
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

// The rows of a table of parameters.
template <typename Param>
std::vector<BadInputRow> rowsOf(const std::vector<Param>& params) {
  std::vector<BadInputRow> rows;
  for (const Param& param : params) rows.push_back(param.row);
  return rows;
}

// The CLI's exit code for an error type: tools/chorus/main.cc's exitCodeFor, which the library's
// tests cannot link; the CLI rows run the binary and so check the real mapping.
inline int exitCodeOfType(const std::string& type) {
  if (type == "ConfigError" || type == kUsage) return 2;
  if (type == "LaunchError") return 3;
  if (type == "CommError" || type == "TimeoutError" || type == "PeerFailure" ||
      type == "AuthError" || type == "ProtocolError")
    return 4;
  if (type == "DeviceError" || type == "OutOfMemoryError") return 5;
  if (type == "CheckpointError") return 6;
  return 1;
}

inline int exitCodeOf(const BadInputRow& row) {
  return row.exit_code >= 0 ? row.exit_code : exitCodeOfType(row.type);
}

// Checks what a caught error shows a user against `row`; for use in EXPECT_TRUE.
inline ::testing::AssertionResult matchesRow(const Error& error, const BadInputRow& row) {
  if (error.kind() != row.type)
    return ::testing::AssertionFailure() << row.id << ": got " << error.kind() << " ("
                                         << error.message() << "), expected " << row.type;
  if (error.message().find(row.excerpt) == std::string::npos)
    return ::testing::AssertionFailure()
           << row.id << ": message '" << error.message() << "' lacks '" << row.excerpt << "'";
  return ::testing::AssertionSuccess();
}

namespace detail {

inline std::string stripCell(std::string cell) {
  const auto begin = cell.find_first_not_of(' ');
  const auto end = cell.find_last_not_of(' ');
  cell = begin == std::string::npos ? "" : cell.substr(begin, end - begin + 1);
  if (cell.size() >= 2 && cell.front() == '`' && cell.back() == '`')
    cell = cell.substr(1, cell.size() - 2);
  return cell;
}

}  // namespace detail

// The rows of docs/errors.md whose id starts with `prefix`: id -> cells (id, input, where, type,
// message excerpt, exit code), each trimmed and without enclosing backticks.
inline std::map<std::string, std::vector<std::string>> documentedRows(const std::string& prefix) {
  std::ifstream file(std::string(CHORUS_SOURCE_DIR) + "/docs/errors.md");
  std::map<std::string, std::vector<std::string>> rows;
  const std::regex row_start("^\\| (" + prefix + "[0-9]+) \\|");
  std::string line;
  while (std::getline(file, line)) {
    if (!std::regex_search(line, row_start)) continue;
    std::vector<std::string> cells;
    std::stringstream split(line.substr(1));
    std::string cell;
    while (std::getline(split, cell, '|')) cells.push_back(detail::stripCell(cell));
    const std::string id = cells.front();
    EXPECT_EQ(rows.count(id), 0u) << "docs/errors.md lists " << id << " twice";
    rows[id] = cells;
  }
  return rows;
}

// Every test row is a row of docs/errors.md with the same type, excerpt and exit code, and every
// documented row with `prefix` is a test row.
inline void expectRowsDocumented(const std::string& prefix, const std::vector<BadInputRow>& rows) {
  auto documented = documentedRows(prefix);
  ASSERT_FALSE(documented.empty()) << "docs/errors.md has no rows " << prefix << "*";
  for (const BadInputRow& row : rows) {
    const auto found = documented.find(row.id);
    if (found == documented.end()) {
      ADD_FAILURE() << row.id << " is tested but not in docs/errors.md";
      continue;
    }
    const std::vector<std::string>& cells = found->second;
    ASSERT_EQ(cells.size(), 6u) << row.id << ": expected 6 cells (id, input, where, type, "
                                << "message, exit code)";
    EXPECT_FALSE(cells[1].empty()) << row.id << ": no input";
    EXPECT_EQ(cells[3], row.type) << row.id;
    EXPECT_EQ(cells[4], row.excerpt) << row.id;
    EXPECT_EQ(cells[5], std::to_string(exitCodeOf(row))) << row.id;
    documented.erase(found);
  }
  for (const auto& [id, cells] : documented)
    ADD_FAILURE() << id << " is in docs/errors.md but no test runs it";
}

}  // namespace chorus::testing
