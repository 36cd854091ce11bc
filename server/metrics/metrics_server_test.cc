#include "server/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/unique_fd.h"
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

// A TCP connection to 127.0.0.1:`port`, or an invalid fd.
UniqueFd Connect(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Everything the server sends until it closes the connection (or `limit` passes).
std::string ReadUntilClosed(int fd, std::chrono::milliseconds limit) {
  std::string got;
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0)
      return got + "<open>";
    char buffer[4096];
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return got;
    got.append(buffer, static_cast<size_t>(n));
  }
}

TEST(MetricsServerTest, IdleConnectionsDoNotKeepAScrapeOut) {
  // Far more idle connections than the bound: each new one closes the oldest idle one, and
  // a scrape is answered at once (it used to wait for the idle ones to time out, one by one
  // per answering thread).
  std::atomic<int> calls{0};
  MetricsLimits limits;
  limits.max_connections = 8;
  limits.request_timeout = absl::Seconds(60);
  auto server = MetricsServer::Start(Loopback(0), 0600, CountingSource(&calls), limits);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(Connect((*server)->bound_port()));
    ASSERT_TRUE(idle.back().valid());
  }
  httplib::Client client("127.0.0.1", (*server)->bound_port());
  client.set_read_timeout(30);
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response) << httplib::to_string(response.error());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(calls.load(), 1);
  // The first idle connections were closed to make room.
  EXPECT_EQ(ReadUntilClosed(idle.front().get(), std::chrono::seconds(10)), "");
  EXPECT_GE((*server)->dropped(), 190u);
  // Counted once the last byte went out, which the client may read first.
  for (int i = 0; i < 1000 && (*server)->answered() == 0; ++i) usleep(10000);
  EXPECT_EQ((*server)->answered(), 1u);
}

TEST(MetricsServerTest, AnOversizedRequestHeadIsRefusedAndNotKept) {
  std::atomic<int> calls{0};
  MetricsLimits limits;
  limits.max_request_head_bytes = 4096;
  auto server = MetricsServer::Start(Loopback(0), 0600, CountingSource(&calls), limits);
  ASSERT_TRUE(server.ok()) << server.status();
  UniqueFd fd = Connect((*server)->bound_port());
  ASSERT_TRUE(fd.valid());
  std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  while (request.size() < 64 * 1024) request += "X-Padding: " + std::string(100, 'a') + "\r\n";
  // The server may close before taking all of it: only what it answers matters.
  (void)send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL);
  const std::string answer = ReadUntilClosed(fd.get(), std::chrono::seconds(10));
  EXPECT_EQ(answer.rfind("HTTP/1.1 431 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("GET /metrics"), std::string::npos) << answer;
  EXPECT_EQ(calls.load(), 0);
  // A request just under the bound is answered.
  UniqueFd ok = Connect((*server)->bound_port());
  std::string small =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(3000, 'b') + "\r\n\r\n";
  ASSERT_EQ(send(ok.get(), small.data(), small.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(small.size()));
  EXPECT_EQ(ReadUntilClosed(ok.get(), std::chrono::seconds(10)).rfind("HTTP/1.1 200 ", 0), 0u);
  EXPECT_EQ(calls.load(), 1);
}

TEST(MetricsServerTest, ARequestNotCompleteInTimeIsClosed) {
  std::atomic<int> calls{0};
  MetricsLimits limits;
  limits.request_timeout = absl::Milliseconds(200);
  auto server = MetricsServer::Start(Loopback(0), 0600, CountingSource(&calls), limits);
  ASSERT_TRUE(server.ok()) << server.status();
  UniqueFd fd = Connect((*server)->bound_port());
  const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";  // no blank line
  ASSERT_EQ(send(fd.get(), partial.data(), partial.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(partial.size()));
  EXPECT_EQ(ReadUntilClosed(fd.get(), std::chrono::seconds(20)), "");
  EXPECT_EQ((*server)->dropped(), 1u);
  EXPECT_EQ(calls.load(), 0);
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
