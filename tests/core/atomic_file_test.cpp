#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class AtomicFileWriterTest : public testing::ScratchDirTest {
 protected:
  size_t entries() const {
    return size_t(std::distance(std::filesystem::directory_iterator(dir_), {}));
  }
};

TEST_F(AtomicFileWriterTest, CommitReplacesTheTargetWithTheNewBytes) {
  auto target = dir_ / "out.bin";
  std::ofstream(target) << "old contents";
  {
    AtomicFileWriter writer(target);
    writer.write("new ", 4);
    writer.write("bytes", 5);
    // Until commit the old file is untouched.
    EXPECT_EQ(read_all(target), "old contents");
    writer.commit();
  }
  EXPECT_EQ(read_all(target), "new bytes");
  EXPECT_EQ(entries(), 1u);  // no temporary left behind
}

TEST_F(AtomicFileWriterTest, AbandonedWriteLeavesTheOldFileAndNoTemporary) {
  auto target = dir_ / "out.bin";
  std::ofstream(target) << "old contents";
  {
    AtomicFileWriter writer(target);
    writer.write("partial", 7);
    EXPECT_TRUE(std::filesystem::exists(writer.temp_path()));
  }
  EXPECT_EQ(read_all(target), "old contents");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(AtomicFileWriterTest, MissingDirectoryIsAClearError) {
  auto target = dir_ / "no_such_dir" / "out.bin";
  try {
    AtomicFileWriter writer(target);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("out.bin"), std::string::npos) << e.what();
  }
}

// A writer given an old file writes over it (the same inode: on tmpfs, its pages) and cuts it to
// what was written; the old file is gone. Without one, or with a missing one, a new file.
TEST_F(AtomicFileWriterTest, AReusedFileIsWrittenOverAndCutToTheNewBytes) {
  const auto old_file = dir_ / "recycled.bin";
  std::ofstream(old_file) << "a longer old content than the new one";
  const auto inode = [](const std::filesystem::path& p) {
    struct stat st {};
    ::stat(p.c_str(), &st);
    return st.st_ino;
  };
  const ino_t before = inode(old_file);
  const auto target = dir_ / "out.bin";
  {
    AtomicFileWriter writer(target, old_file);
    writer.write("new bytes", 9);
    writer.commit();
  }
  EXPECT_EQ(read_all(target), "new bytes");
  EXPECT_EQ(inode(target), before);
  EXPECT_FALSE(std::filesystem::exists(old_file));
  {
    AtomicFileWriter writer(dir_ / "fresh.bin", dir_ / "no-such-file");
    writer.write("fresh", 5);
    writer.commit();
  }
  EXPECT_EQ(read_all(dir_ / "fresh.bin"), "fresh");
}

}  // namespace
}  // namespace lattice
