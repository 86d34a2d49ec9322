// Inputs that the fuzz targets of fuzz/ found to break the store, each pinned down as the
// behaviour it must have now (docs/security.md, "Fuzzing": the findings and their fixes).
#include <gtest/gtest.h>

#include <chrono>

#include "chorus/comm/store/memory_store.h"
#include "chorus/comm/store/store.h"
#include "chorus/core/error.h"

namespace chorus::comm {
namespace {

// fuzz/store_server_fuzzer.cc (UBSan): a get request whose timeout was -72057592236115712 ms
// made the server compute now + timeout in nanoseconds, a signed overflow (undefined behaviour)
// in a server thread, from a client's bytes. A timeout at or below zero is an expired deadline.
TEST(StoreFuzzRegression, HugeNegativeTimeoutIsAnExpiredDeadline) {
  const Deadline deadline = deadlineFor(Millis(-72057592236115712LL));
  EXPECT_TRUE(deadline.expired());
  EXPECT_EQ(deadline.remaining(), Millis(0));
  EXPECT_TRUE(deadlineFor(Millis::min()).expired());
  MemoryStore store;
  EXPECT_THROW(store.get("missing", Millis(-72057592236115712LL)), TimeoutError);
  EXPECT_THROW(store.wait({"missing"}, Millis::min()), TimeoutError);
  store.set("present", toBytes("v"));
  EXPECT_EQ(toString(store.get("present", Millis::min())), "v");
}

}  // namespace
}  // namespace chorus::comm
