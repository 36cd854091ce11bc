#include "server/metrics/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "server/metrics/prometheus_text.h"

namespace ferry {
namespace {

// A status whose batches_delivered counts the scrapes: each scrape asks the source anew.
MetricsServer::StatusSource CountingSource(std::atomic<int>* calls) {
  return [calls] {
    ferry::v1::GetStatusResponse status;
    status.mutable_daemon()->set_version("test");
    ferry::v1::JobStatus* job = status.add_jobs();
    job->mutable_job()->set_id("j1");
    job->mutable_job()->set_name("n");
    job->add_ranks()->set_batches_delivered(++*calls);
    return status;
  };
}

MetricsAddress Loopback(int port) {
  auto address = ParseMetricsAddress("127.0.0.1:" + std::to_string(port));
  EXPECT_TRUE(address.ok());
  return *address;
}

TEST(MetricsServerTest, ServesTheStatusOnLoopbackTcp) {
  std::atomic<int> calls{0};
  auto server = MetricsServer::Start(Loopback(0), 0600, CountingSource(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->bound_port(), 0);
  httplib::Client client("127.0.0.1", (*server)->bound_port());
  for (int scrape = 1; scrape <= 2; ++scrape) {
    auto response = client.Get("/metrics");
    ASSERT_TRUE(response) << httplib::to_string(response.error());
    EXPECT_EQ(response->status, 200);
    EXPECT_EQ(response->get_header_value("Content-Type"), kPrometheusContentType);
    EXPECT_NE(response->body.find("ferry_rank_batches_delivered_total{job_id=\"j1\",job_name=\"n\","
                                  "rank=\"0\"} " +
                                  std::to_string(scrape) + "\n"),
              std::string::npos)
        << response->body;
  }
  auto other = client.Get("/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
}

TEST(MetricsServerTest, APortInUseIsRefusedNamingIt) {
  std::atomic<int> calls{0};
  auto first = MetricsServer::Start(Loopback(0), 0600, CountingSource(&calls));
  ASSERT_TRUE(first.ok()) << first.status();
  const int port = (*first)->bound_port();
  auto second = MetricsServer::Start(Loopback(port), 0600, CountingSource(&calls));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << second.status();
  EXPECT_NE(second.status().message().find("metrics_listen"), std::string::npos);
}

TEST(MetricsServerTest, ServesOnAUnixSocketWithItsModeAndRemovesIt) {
  char dir_template[] = "/tmp/ferry-metrics-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/metrics.sock";
  auto address = ParseMetricsAddress("unix:" + path);
  ASSERT_TRUE(address.ok());
  std::atomic<int> calls{0};
  {
    auto server = MetricsServer::Start(*address, 0660, CountingSource(&calls));
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->bound_port(), 0);
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0660u);

    httplib::Client client(path, 80);
    client.set_address_family(AF_UNIX);
    auto response = client.Get("/metrics");
    ASSERT_TRUE(response) << httplib::to_string(response.error());
    EXPECT_EQ(response->status, 200);
    EXPECT_NE(response->body.find("# TYPE ferry_rank_stall_ratio gauge\n"), std::string::npos);

    // A second ferryd may not take over a socket that is being served.
    auto second = MetricsServer::Start(*address, 0660, CountingSource(&calls));
    EXPECT_FALSE(second.ok());
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "socket left behind";
  rmdir(dir_template);
}

TEST(MetricsServerTest, StopsWhenDestroyedAtOnce) {
  // Destroyed before its thread has begun to listen: must not hang.
  std::atomic<int> calls{0};
  for (int i = 0; i < 20; ++i) {
    auto server = MetricsServer::Start(Loopback(0), 0600, CountingSource(&calls));
    ASSERT_TRUE(server.ok()) << server.status();
  }
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
}  // namespace ferry
