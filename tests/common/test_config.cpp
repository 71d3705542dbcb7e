#include <catch2/catch.hpp>

#include "common/datatype.hpp"
#include "common/error.hpp"
#include "common/params.hpp"

using namespace topoccl;

TEST_CASE("config registry reads overrides, environment and defaults in that order") {
  config::clearOverrides();
  ::unsetenv("TOPOCCL_SLICE_BYTES");
  CHECK(params::kSliceBytes.get() == (512 << 10));
  ::setenv("TOPOCCL_SLICE_BYTES", "0x1000", 1);
  CHECK(params::kSliceBytes.get() == 4096);
  config::setOverride("TOPOCCL_SLICE_BYTES", "777");
  CHECK(params::kSliceBytes.get() == 777);
  config::clearOverrides();
  ::unsetenv("TOPOCCL_SLICE_BYTES");
}

TEST_CASE("a malformed setting is an error that names the variable") {
  config::setOverride("NCCL_SHM_DISABLE", "maybe");
  try {
    (void)params::kShmDisable.get();
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    CHECK(std::string(e.what()).find("NCCL_SHM_DISABLE") != std::string::npos);
  }
  config::setOverride("TOPOCCL_TIMEOUT_MS", "12x");
  CHECK_THROWS_AS(params::kTimeoutMs.get(), Error);
  config::clearOverrides();
}

TEST_CASE("every registered parameter has a name and a doc") {
  const auto& all = config::allParams();
  REQUIRE(all.size() >= 10);
  for (const auto& p : all) {
    CHECK(std::string(p.name).size() > 4);
    CHECK(std::string(p.doc).size() > 10);
  }
}

TEST_CASE("datatype sizes match NCCL's element sizes") {
  CHECK(dataTypeSize(DataType::Int8) == 1);
  CHECK(dataTypeSize(DataType::Float8e5m2) == 1);
  CHECK(dataTypeSize(DataType::Bfloat16) == 2);
  CHECK(dataTypeSize(DataType::Uint32) == 4);
  CHECK(dataTypeSize(DataType::Float64) == 8);
  CHECK(isValidDataType(11));
  CHECK_FALSE(isValidDataType(12));
  CHECK_FALSE(isValidDataType(-1));
}
