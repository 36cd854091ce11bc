#include "server/metrics/metrics_address.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(MetricsAddressTest, LoopbackAddresses) {
  for (const char* text : {"127.0.0.1:9464", "127.1.2.3:1", "[::1]:9464", "localhost:0"}) {
    auto address = ParseMetricsAddress(text);
    ASSERT_TRUE(address.ok()) << text << ": " << address.status();
    EXPECT_TRUE(address->loopback) << text;
    EXPECT_FALSE(address->unix_socket) << text;
  }
  auto v6 = ParseMetricsAddress("[::1]:9464");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9464);
  EXPECT_EQ(FormatMetricsAddress(*v6), "[::1]:9464");
}

TEST(MetricsAddressTest, UnixSocketIsLocal) {
  auto address = ParseMetricsAddress("unix:/run/ferry/metrics.sock");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_TRUE(address->unix_socket);
  EXPECT_TRUE(address->loopback);
  EXPECT_EQ(address->path, "/run/ferry/metrics.sock");
  EXPECT_EQ(FormatMetricsAddress(*address), "unix:/run/ferry/metrics.sock");
}

TEST(MetricsAddressTest, OtherInterfacesAreNotLoopback) {
  for (const char* text : {"0.0.0.0:9464", "10.1.2.3:9464", "[::]:9464", "[fe80::1]:80"}) {
    auto address = ParseMetricsAddress(text);
    ASSERT_TRUE(address.ok()) << text << ": " << address.status();
    EXPECT_FALSE(address->loopback) << text;
  }
}

TEST(MetricsAddressTest, MalformedAddressesAreRefusedWithTheForms) {
  for (const char* text :
       {"9464", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:x", "::1:9464", "[::1]9464",
        "metrics.example.com:9464", "unix:relative.sock", "unix:"}) {
    auto address = ParseMetricsAddress(text);
    ASSERT_FALSE(address.ok()) << text;
    EXPECT_EQ(address.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(address.status().message().find(std::string("metrics_listen '") + text + "'"),
              std::string::npos)
        << address.status();
    EXPECT_NE(address.status().message().find("127.0.0.1:9464"), std::string::npos);
  }
}

}  // namespace
}  // namespace ferry
