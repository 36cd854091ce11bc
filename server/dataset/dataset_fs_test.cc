// DatasetFs: dataset_roots hold for every open (symbolic links and '..' below a root cannot
// lead out of it), the follow-within-roots switch, listings, and the error classes.
#include "server/dataset/dataset_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>

#include "common/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class DatasetFsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ferry_dataset_fs_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    fs::create_directories(dir_ / "root/train/cat");
    fs::create_directories(dir_ / "other/secret");
    fs::create_directories(dir_ / "second");
    Write(dir_ / "root/train/cat/a.jpg", "inside");
    Write(dir_ / "other/secret/key", "TOP SECRET");
    Write(dir_ / "second/shared.jpg", "second root");
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void Write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }
  std::string P(const std::string& rel) const { return (dir_ / rel).string(); }

  std::shared_ptr<const DatasetFs> Confined(bool follow) {
    DatasetAccess access;
    access.roots = {P("root"), P("second")};
    access.follow_symlinks_within_roots = follow;
    access.config_path = "/etc/ferry/ferryd.conf";
    return *MakeDatasetFs(access);
  }

  static std::string Read(const DatasetFs& fs, const std::string& path) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs.OpenFile(path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return "";
    uint8_t buf[64];
    absl::StatusOr<size_t> n = ReadUpTo(**file, 0, absl::MakeSpan(buf));
    EXPECT_TRUE(n.ok()) << n.status();
    return std::string(reinterpret_cast<const char*>(buf), n.ok() ? *n : 0);
  }

  fs::path dir_;
};

TEST_F(DatasetFsTest, FilesUnderARootAreRead) {
  auto strict = Confined(false);
  EXPECT_EQ(Read(*strict, P("root/train/cat/a.jpg")), "inside");
  EXPECT_EQ(Read(*strict, P("root/train/./cat/../cat/a.jpg")), "inside");
  EXPECT_TRUE(strict->CheckPath(P("root")).ok());
}

// A FIFO where a dataset file should be: opening it must not wait for a writer (that held
// a worker, or a CreateJob handler, forever); it is refused as no regular file, mapped or
// read, confined or not.
TEST_F(DatasetFsTest, AFifoIsRefusedWithoutBlocking) {
  ASSERT_EQ(mkfifo(P("root/train/cat/b.jpg").c_str(), 0600), 0);
  for (const std::shared_ptr<const DatasetFs>& fs : {Confined(false), UnconfinedDatasetFs()}) {
    auto opened = std::async(std::launch::async, [&] {
      return std::make_pair(fs->OpenFile(P("root/train/cat/b.jpg")).status(),
                            fs->MapFile(P("root/train/cat/b.jpg")).status());
    });
    if (opened.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "opening a FIFO blocked";
      // Unblock the reader: open the FIFO for writing, twice (OpenFile, then MapFile).
      for (int i = 0; i < 2; ++i) close(open(P("root/train/cat/b.jpg").c_str(), O_WRONLY));
      opened.wait();
      continue;
    }
    const auto [file, map] = opened.get();
    EXPECT_EQ(file.code(), absl::StatusCode::kInvalidArgument) << file;
    EXPECT_THAT(file.message(), HasSubstr("is not a regular file (a FIFO)"));
    EXPECT_EQ(map.code(), absl::StatusCode::kInvalidArgument) << map;
  }
}

TEST_F(DatasetFsTest, PathsOutsideTheRootsAreDeniedNamingTheRootsAndTheConfig) {
  auto strict = Confined(false);
  for (const std::string& path :
       {P("other/secret/key"), P("root/../other/secret/key"), P("roots/x"), P("roo")}) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> fd = strict->OpenFile(path);
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(fd.status().message(), HasSubstr("not under any configured dataset_roots"));
    EXPECT_THAT(fd.status().message(), HasSubstr(P("root")));
    EXPECT_THAT(fd.status().message(), HasSubstr("/etc/ferry/ferryd.conf"));
  }
  EXPECT_EQ(strict->CheckPath("relative/x").code(), absl::StatusCode::kInvalidArgument);
}

// The escape the attacker used: a link inside an allowed tree to a file outside it.
TEST_F(DatasetFsTest, SymlinksBelowARootAreRefusedByDefault) {
  fs::create_symlink(P("other/secret/key"), P("root/train/cat/b.jpg"));
  fs::create_directory_symlink(P("other/secret"), P("root/train/dog"));
  fs::create_symlink(P("root/train/cat/a.jpg"), P("root/train/cat/inside.jpg"));
  auto strict = Confined(false);
  for (const std::string& path :
       {P("root/train/cat/b.jpg"), P("root/train/dog/key"), P("root/train/cat/inside.jpg")}) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> fd = strict->OpenFile(path);
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(fd.status().message(), HasSubstr("symbolic link"));
    EXPECT_THAT(fd.status().message(), HasSubstr("follow_symlinks_within_roots"));
    EXPECT_THAT(fd.status().message(), Not(HasSubstr("TOP SECRET")));
  }
}

TEST_F(DatasetFsTest, FollowedLinksMayStayWithinTheRootsButNeverLeaveThem) {
  fs::create_symlink(P("other/secret/key"), P("root/train/cat/b.jpg"));
  fs::create_directory_symlink(P("other/secret"), P("root/train/dog"));
  fs::create_symlink(P("root/train/cat/a.jpg"), P("root/train/cat/inside.jpg"));
  fs::create_symlink(P("second/shared.jpg"), P("root/train/cat/shared.jpg"));
  auto follow = Confined(true);
  EXPECT_EQ(Read(*follow, P("root/train/cat/inside.jpg")), "inside");
  EXPECT_EQ(Read(*follow, P("root/train/cat/shared.jpg")), "second root");  // another root
  for (const std::string& path : {P("root/train/cat/b.jpg"), P("root/train/dog/key")}) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> fd = follow->OpenFile(path);
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(fd.status().message(), HasSubstr("leads outside dataset_roots"));
  }
}

TEST_F(DatasetFsTest, ListingsReportLinksAsLinksUnlessFollowed) {
  fs::create_directory_symlink(P("other/secret"), P("root/train/dog"));
  fs::create_directory_symlink(P("root/train/cat"), P("root/train/kitten"));
  auto types = [&](const DatasetFs& fs) {
    std::map<std::string, DatasetFs::EntryType> out;
    absl::StatusOr<std::vector<DatasetFs::Entry>> entries = fs.ListDirectory(P("root/train"));
    EXPECT_TRUE(entries.ok()) << entries.status();
    for (const DatasetFs::Entry& e : entries.value()) out[e.name] = e.type;
    return out;
  };
  using T = DatasetFs::EntryType;
  EXPECT_EQ(types(*Confined(false)),
            (std::map<std::string, T>{
                {"cat", T::kDirectory}, {"dog", T::kSymlink}, {"kitten", T::kSymlink}}));
  EXPECT_EQ(types(*Confined(true)),
            (std::map<std::string, T>{
                {"cat", T::kDirectory}, {"dog", T::kSymlink}, {"kitten", T::kDirectory}}));
  EXPECT_EQ(types(*UnconfinedDatasetFs()),
            (std::map<std::string, T>{
                {"cat", T::kDirectory}, {"dog", T::kDirectory}, {"kitten", T::kDirectory}}));
  EXPECT_EQ(Confined(false)->ListDirectory(P("root/train/cat/a.jpg")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DatasetFsTest, ErrorsNameThePathWithTheirClass) {
  auto strict = Confined(false);
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> missing = strict->OpenFile(P("root/nope.jpg"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("dataset path '" + P("root/nope.jpg") + "' does not exist"));
  EXPECT_EQ(strict->OpenFile(P("root/train")).status().code(), absl::StatusCode::kInvalidArgument);
  // A request may name a path of any length; the message quotes a bounded part of it.
  const std::string long_path = P("root/") + std::string(5000, 'a');
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> too_long = strict->OpenFile(long_path);
  EXPECT_FALSE(too_long.ok());
  EXPECT_LT(too_long.status().message().size(), 1200u);
  EXPECT_THAT(too_long.status().message(), HasSubstr("5"));
}

// Out of descriptors is a condition of the machine, not of the data.
TEST_F(DatasetFsTest, RunningOutOfDescriptorsIsATransientResourceError) {
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  std::vector<UniqueFd> hog;
  struct rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  for (;;) {
    UniqueFd fd(::dup(0));
    if (!fd.valid()) break;
    hog.push_back(std::move(fd));
  }
  for (const auto& fs : {Confined(false), UnconfinedDatasetFs()}) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> fd = fs->OpenFile(P("root/train/cat/a.jpg"));
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kResourceExhausted) << fd.status();
    EXPECT_TRUE(IsTransientReadError(fd.status()));
  }
  hog.clear();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(Read(*Confined(false), P("root/train/cat/a.jpg")), "inside");
}

TEST(FileErrnoStatusTest, MachineConditionsAreTransientDataConditionsAreNot) {
  for (int err : {EMFILE, ENFILE, ENOMEM, EIO, EAGAIN, ESTALE, ETIMEDOUT}) {
    EXPECT_TRUE(IsTransientReadError(FileErrnoStatus(err, "cannot read", "/d/x"))) << err;
  }
  for (int err : {ENOENT, EACCES, EISDIR, ENOSPC, EFBIG, EINVAL}) {
    EXPECT_FALSE(IsTransientReadError(FileErrnoStatus(err, "cannot read", "/d/x"))) << err;
  }
  EXPECT_THAT(FileErrnoStatus(EIO, "cannot read", "/d/x").message(),
              HasSubstr("cannot read '/d/x': "));
}

}  // namespace
}  // namespace ferry
