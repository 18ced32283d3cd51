// Secrets from files, compared in constant time (xsilo/core/secret.h).
#include "xsilo/core/secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace xsilo {
namespace {

TEST(SecretEquals, EqualOnlyWhenEveryByteAndTheLengthAgree) {
  EXPECT_TRUE(SecretEquals("", ""));
  EXPECT_TRUE(SecretEquals("token-1234", "token-1234"));
  EXPECT_FALSE(SecretEquals("token-1234", "token-1235"));
  EXPECT_FALSE(SecretEquals("Xoken-1234", "token-1234"));
  EXPECT_FALSE(SecretEquals("token", "token-1234")) << "a prefix is not the token";
  EXPECT_FALSE(SecretEquals("token-1234", "token"));
  EXPECT_FALSE(SecretEquals("", "token"));
  EXPECT_FALSE(SecretEquals("token", ""));
  const std::string with_nul("a\0b", 3);
  EXPECT_FALSE(SecretEquals(with_nul, std::string("a\0c", 3)));
  EXPECT_TRUE(SecretEquals(with_nul, std::string("a\0b", 3)));
}

TEST(ReadSecretFile, ReadsAPrivateFileAndRefusesAnyOther) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("xsilo-secret-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "secret").string();
  std::ofstream(path) << "s3cr3t value\n\n";
  ::chmod(path.c_str(), 0600);
  auto got = ReadSecretFile(path);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "s3cr3t value") << "trailing whitespace is not part of it";

  ::chmod(path.c_str(), 0640);
  auto shared = ReadSecretFile(path);
  ASSERT_FALSE(shared.ok());
  EXPECT_NE(shared.status().message().find("chmod 600"), std::string::npos);
  EXPECT_EQ(shared.status().message().find("s3cr3t"), std::string::npos) << "names the content";

  std::ofstream(path, std::ios::trunc) << "\n";
  ::chmod(path.c_str(), 0600);
  EXPECT_FALSE(ReadSecretFile(path).ok()) << "an empty secret";
  EXPECT_FALSE(ReadSecretFile((dir / "absent").string()).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xsilo
