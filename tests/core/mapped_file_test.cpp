#include "core/mapped_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "support/scratch_dir.h"

namespace lattice {
namespace {

// A path `name` in a fresh directory of its own (the file itself is not created).
std::filesystem::path scratch(const std::string& name) {
  return testing::scratch_dir("mapped_file_" + name) / name;
}

TEST(MappedFile, MapsEveryByteOfTheFile) {
  auto path = scratch("bytes.bin");
  std::string payload = "hello\0mapped world";
  payload.push_back('\xff');
  std::ofstream(path, std::ios::binary).write(payload.data(), std::streamsize(payload.size()));

  MappedFile file(path);
  ASSERT_EQ(file.size(), payload.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.bytes().data()), file.size()), payload);
  EXPECT_EQ(file.path(), path);

  MappedFile moved(std::move(file));
  EXPECT_EQ(moved.size(), payload.size());
  EXPECT_EQ(static_cast<char>(moved.bytes()[payload.size() - 1]), '\xff');
  std::filesystem::remove(path);
}

TEST(MappedFile, EmptyFileHasNoBytes) {
  auto path = scratch("empty.bin");
  std::ofstream(path, std::ios::binary).close();
  MappedFile file(path);
  EXPECT_EQ(file.size(), 0u);
  EXPECT_TRUE(file.bytes().empty());
  std::filesystem::remove(path);
}

TEST(MappedFile, MissingFileNamesThePath) {
  auto path = scratch("does_not_exist.bin");
  try {
    MappedFile file(path);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

TEST(MappedFile, DirectoryIsRefused) {
  // Braces: with parentheses clang reads the statement as declaring a variable.
  EXPECT_THROW(MappedFile{std::filesystem::temp_directory_path()}, IoError);
}

}  // namespace
}  // namespace lattice
