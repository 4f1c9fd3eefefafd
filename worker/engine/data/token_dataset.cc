#include "worker/engine/data/token_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::engine {
namespace {

// Opened without blocking (a FIFO in the data's place would hang the open)
// and read only when it is a regular file: a directory made the stream
// library throw from inside its read, and the rank aborted (a crash, so
// healthy nodes were blamed) instead of exiting 3 (the job cannot run).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, const char* what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat(what, " ", path, ": cannot open (missing file or no permission)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", path, ": not a regular file (a directory, device or FIFO cannot be read)"));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // an error, or the file shrank under us
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (done != bytes.size()) {
    return absl::DataLossError(absl::StrCat(what, " ", path, ": read error"));
  }
  return bytes;
}

absl::Status CheckVocab(const std::vector<uint16_t>& tokens, int64_t vocab_size,
                        const std::string& path, const char* unit) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      // The value is the file's content and is not shown: the message goes to
      // the job's status, which other readers of the cluster may see.
      return absl::InvalidArgumentError(absl::StrCat(
          "data file ", path, ": the ", unit, " at token index ", i,
          " is not below model.vocab_size=", vocab_size));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint16_t>> ParseTokenFile(const std::string& bytes,
                                                     const std::string& path) {
  constexpr int64_t kHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat("token file ", path, ": truncated header (", size,
                                            " bytes; an llm.c token file starts with ",
                                            kHeaderBytes, " header bytes)"));
  }
  int32_t header[kTokenFileHeaderInts];
  std::memcpy(header, bytes.data(), kHeaderBytes);
  if (header[0] != kTokenFileMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, ": wrong magic number (want ", kTokenFileMagic,
        "; not an llm.c/nanoGPT token file — use data.format: text for raw text)"));
  }
  if (header[1] != kTokenFileVersion) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path,
                                                   ": unsupported version (want ",
                                                   kTokenFileVersion, ", uint16 tokens)"));
  }
  const int64_t count = header[2];
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path, ": negative token count in the header"));
  }
  const int64_t payload = size - kHeaderBytes;
  if (payload != count * 2) {
    return absl::DataLossError(absl::StrCat(
        "token file ", path, ": ", payload < count * 2 ? "truncated" : "trailing bytes",
        ": the header's token count does not match the file's ", payload, " token bytes"));
  }
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  std::memcpy(tokens.data(), bytes.data() + kHeaderBytes, static_cast<size_t>(count) * 2);
  return tokens;
}

}  // namespace

absl::StatusOr<TokenDataset> TokenDataset::Load(const std::string& path, spec::DataFormat format,
                                                int64_t vocab_size) {
  const bool bin = format == spec::DataFormat::kBin;
  absl::StatusOr<std::string> bytes = ReadWholeFile(path, bin ? "token file" : "text file");
  if (!bytes.ok()) return bytes.status();
  TokenDataset ds;
  ds.path_ = path;
  if (bin) {
    absl::StatusOr<std::vector<uint16_t>> tokens = ParseTokenFile(*bytes, path);
    if (!tokens.ok()) return tokens.status();
    ds.tokens_ = std::move(*tokens);
  } else {
    ds.tokens_.resize(bytes->size());
    for (size_t i = 0; i < bytes->size(); ++i) {
      ds.tokens_[i] = static_cast<unsigned char>((*bytes)[i]);
    }
  }
  if (absl::Status s = CheckVocab(ds.tokens_, vocab_size, path, bin ? "token id" : "byte");
      !s.ok()) {
    return s;
  }
  return ds;
}

TokenDataset TokenDataset::FromTokens(std::vector<uint16_t> tokens, std::string name) {
  TokenDataset ds;
  ds.tokens_ = std::move(tokens);
  ds.path_ = std::move(name);
  return ds;
}

absl::Status WriteTokenFile(const std::string& path, const std::vector<uint16_t>& tokens) {
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("token file ", path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace loom::engine
