// AtomicOutputFile (util/output_file.h): the rule every output path of sluice follows. A target
// is created or (forced) a regular file replaced only by a rename of a complete temporary file;
// links, FIFOs and directories are never replaced; a failure removes only the temporary file.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "util/error.h"
#include "util/output_file.h"

#include "test_util.h"

namespace fs = std::filesystem;
using sluice::AtomicOutputFile;
using sluice::Existing;
using sluice::test::slurp;
using sluice::test::TempDir;

namespace {

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

// The message of the Error `f` throws ("" when it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const sluice::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(AtomicOutputFile, TargetAppearsCompleteOnlyOnCommitAndNoTempStays) {
  TempDir dir("sluice_aof");
  const std::string target = dir / "out.bin";
  {
    AtomicOutputFile f(target, Existing::Refuse);
    f.write("hello ");
    f.write("world");
    EXPECT_FALSE(fs::exists(target)) << "visible before commit";
    EXPECT_EQ(fs::path(f.temp_path()).parent_path(), dir.path) << "the temp file lives beside the target";
    f.commit();
  }
  EXPECT_EQ(slurp(target), "hello world");
  EXPECT_EQ(names_in(dir.path), std::set<std::string>{"out.bin"});
}

TEST(AtomicOutputFile, AbandonedWriteRemovesOnlyItsTempFile) {
  TempDir dir("sluice_aof");
  std::ofstream(dir / "neighbour") << "not ours";
  {
    AtomicOutputFile f(dir / "out.bin", Existing::Refuse);
    f.write("partial");
  }  // destroyed without commit, as when an exception unwinds
  EXPECT_EQ(names_in(dir.path), std::set<std::string>{"neighbour"});
  EXPECT_EQ(slurp(dir / "neighbour"), "not ours");
}

TEST(AtomicOutputFile, ExistingFileIsRefusedUnlessReplaceAndKeptOnFailure) {
  TempDir dir("sluice_aof");
  const std::string target = dir / "out.bin";
  std::ofstream(target) << "precious";
  const std::string err = error_of([&] { AtomicOutputFile f(target, Existing::Refuse); });
  EXPECT_NE(err.find(target), std::string::npos) << err;
  EXPECT_NE(err.find("already exists"), std::string::npos) << err;
  EXPECT_NE(err.find("--force"), std::string::npos) << err;
  EXPECT_EQ(slurp(target), "precious");
  {
    AtomicOutputFile f(target, Existing::Replace);
    f.write("half of a new file");
  }  // failed: the old file is still there, byte for byte
  EXPECT_EQ(slurp(target), "precious");
  {
    AtomicOutputFile f(target, Existing::Replace);
    f.write("new");
    f.commit();
  }
  EXPECT_EQ(slurp(target), "new");
  EXPECT_EQ(names_in(dir.path), std::set<std::string>{"out.bin"});
}

TEST(AtomicOutputFile, SymlinkFifoAndDirectoryAreNeverReplaced) {
  TempDir dir("sluice_aof");
  const std::string victim = dir / "victim", link = dir / "link", fifo = dir / "fifo", sub = dir / "sub";
  std::ofstream(victim) << "someone else's";
  fs::create_symlink(victim, link);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_directory(sub);
  for (const auto& [path, kind] : {std::pair{link, "symbolic link"}, {fifo, "FIFO"}, {sub, "directory"}}) {
    for (const Existing e : {Existing::Refuse, Existing::Replace}) {
      SCOPED_TRACE(path);
      const std::string err = error_of([&] { AtomicOutputFile f(path, e); });
      EXPECT_NE(err.find(path), std::string::npos) << err;
      EXPECT_NE(err.find(kind), std::string::npos) << err;
    }
  }
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), victim);
  EXPECT_EQ(slurp(victim), "someone else's");
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_directory(sub) && fs::is_empty(sub));
  EXPECT_EQ(names_in(dir.path), (std::set<std::string>{"victim", "link", "fifo", "sub"}));
}

TEST(AtomicOutputFile, WhatAppearsAtTheTargetMeanwhileIsNotReplaced) {
  TempDir dir("sluice_aof");
  const std::string target = dir / "out.bin";
  {
    AtomicOutputFile f(target, Existing::Refuse);
    f.write("mine");
    std::ofstream(target) << "theirs";  // created by someone else while we wrote
    const std::string err = error_of([&] { f.commit(); });
    EXPECT_NE(err.find(target), std::string::npos) << err;
  }
  EXPECT_EQ(slurp(target), "theirs");
  const std::string victim = dir / "victim";
  std::ofstream(victim) << "someone else's";
  fs::remove(target);
  {
    AtomicOutputFile f(target, Existing::Replace);
    f.write("mine");
    fs::create_symlink(victim, target);  // a link planted before the rename
    const std::string err = error_of([&] { f.commit(); });
    EXPECT_NE(err.find("symbolic link"), std::string::npos) << err;
  }
  EXPECT_TRUE(fs::is_symlink(target));
  EXPECT_EQ(slurp(victim), "someone else's");
  EXPECT_EQ(names_in(dir.path), (std::set<std::string>{"out.bin", "victim"}));
}
