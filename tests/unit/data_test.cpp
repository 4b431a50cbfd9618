// data/: the tokenizers (any bytes round-trip; BPE training is deterministic and learns the
// most frequent pair first), the token shards and their manifest (every defect named), the global
// order (a bijection per epoch, mixtures in proportion), prepare's handling of bad input, and
// llm.c's token files imported (the same documents; every bad file named).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "data/import.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/token_data.h"
#include "data/tokenizer.h"
#include "tests/harness/llmc_files.h"

namespace troupe::data {
namespace {

namespace fs = std::filesystem;

struct Dir {
  Dir() {
    char t[] = "/tmp/troupe-data-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~Dir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
  std::string path;
};

void write(const std::string& path, const std::string& body) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << body;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

const std::string kGpl = read("/usr/share/common-licenses/GPL-3");

Tokenizer trained(size_t vocab) {
  WordCounts w;
  w.add(kGpl);
  return Tokenizer::train_bpe(w, vocab);
}

std::string random_bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = char(rng() & 0xff);
  return s;
}

TEST(Tokenizer, SplitWordsCoversTheTextAndKeepsWordsShort) {
  std::mt19937 rng(1);
  for (const std::string& text :
       {kGpl, random_bytes(rng, 5000), std::string(300, ' '), std::string("a"), std::string()}) {
    std::string joined;
    split_words(text, [&](std::string_view w) {
      EXPECT_FALSE(w.empty());
      EXPECT_LE(w.size(), kMaxWordBytes);
      joined += w;
    });
    EXPECT_EQ(joined, text);
  }
  std::vector<std::string> words;
  split_words("Hello  world, 42x\n", [&](std::string_view w) { words.emplace_back(w); });
  EXPECT_EQ(words, (std::vector<std::string>{"Hello", " ", " world", ",", " 42", "x", "\n"}));
}

TEST(Tokenizer, AnyBytesRoundTripThroughByteAndBpe) {
  std::mt19937 rng(7);
  Tokenizer bpe = trained(600), bytes = Tokenizer::bytes();
  ASSERT_EQ(bpe.vocab_size(), 600u);
  EXPECT_EQ(bytes.vocab_size(), 257u);
  std::vector<std::string> inputs = {kGpl, "", "\xff\xfe\x00\x80 invalid \xc3\x28 UTF-8",
                                     std::string(1000, '\0'), "<|endoftext|>"};
  for (size_t n : {1, 2, 3, 63, 64, 65, 1000, 70000}) inputs.push_back(random_bytes(rng, n));
  for (auto* t : {&bpe, &bytes}) {
    for (const std::string& x : inputs) {
      const std::vector<uint32_t> ids = t->encode(x);
      for (uint32_t id : ids) ASSERT_LT(id, t->end_of_document()) << "never the end id";
      std::string back;
      t->decode(ids.data(), ids.size(), back);
      ASSERT_EQ(back, x) << t->kind() << " on " << x.size() << " bytes";
    }
  }
  EXPECT_LT(bpe.encode(kGpl).size() * 5, kGpl.size() * 2) << "600 ids: English > 2.5x smaller";
}

// What prepare and `troupe data encode` rely on to work in pieces: cut at stable_prefix, the
// pieces encode (and count) exactly as the whole text does.
TEST(Tokenizer, PiecesCutAtTheStablePrefixEncodeAsTheWhole) {
  std::mt19937 rng(11);
  Tokenizer bpe = trained(500);
  std::string mixed;  // runs of every class, whitespace of every kind, long runs
  const std::string parts[] = {" ",
                               "  ",
                               "\n",
                               "\n\n ",
                               "\t",
                               "word",
                               "Word",
                               "42",
                               "1234567",
                               ",",
                               "...",
                               "\xc3\xa9t\xc3\xa9",
                               std::string(70, 'x').c_str(),
                               "   z"};
  for (int i = 0; i < 20000; ++i) mixed += parts[rng() % 14];
  for (const std::string& text : {kGpl, mixed, random_bytes(rng, 30000)}) {
    const std::vector<uint32_t> whole = bpe.encode(text);
    std::vector<uint32_t> pieces;
    WordCounts a, b;
    a.add(text);
    std::string_view rest(text);
    while (!rest.empty()) {
      const size_t want = 1 + rng() % 300;
      size_t cut = want >= rest.size() ? rest.size() : stable_prefix(rest.substr(0, want));
      if (cut == 0) cut = std::min(rest.size(), want) == rest.size() ? rest.size() : 0;
      if (cut == 0) {  // (fewer than two words in the window: take a longer one)
        cut = stable_prefix(rest.substr(0, std::min(rest.size(), want + 300)));
        if (cut == 0) cut = rest.size();
      }
      bpe.encode(rest.substr(0, cut), pieces);
      b.add(rest.substr(0, cut));
      rest.remove_prefix(cut);
    }
    EXPECT_EQ(pieces, whole);
    EXPECT_EQ(a.counts(), b.counts());
  }
}

TEST(Tokenizer, BpeLearnsTheMostFrequentPairFirstAndIsDeterministic) {
  WordCounts w;
  w.add("aab aab aab abb abb cd");  // words "aab", " aab" x2, " abb" x2, " cd"
  const Tokenizer t = Tokenizer::train_bpe(w, 257 + 3);
  ASSERT_EQ(t.merges().size(), 3u);
  // Pairs: (a,b) 5 times; (" ",a) 4; (a,a) 3; (b,b) 2: (a,b) first. Then, with X = ab:
  // (a,X) 3; (" ",a) 2; (" ",X) 2; (X,b) 2: (a,X) = Y, which takes every (" ",a). Then
  // (" ",X), (" ",Y) and (X,b) tie at 2: the smallest pair, (" ",X).
  EXPECT_EQ(t.merges()[0], Tokenizer::Merge('a', 'b'));
  EXPECT_EQ(t.merges()[1], Tokenizer::Merge('a', 256));
  EXPECT_EQ(t.merges()[2], Tokenizer::Merge(' ', 256));
  EXPECT_EQ(trained(700).merges(), trained(700).merges());
  const Tokenizer small = trained(300), large = trained(700);
  EXPECT_TRUE(std::equal(small.merges().begin(), small.merges().end(), large.merges().begin()))
      << "a larger vocabulary extends a smaller one";
}

// Words past the bound: the rarest dropped as they come (memory grew with every distinct word of
// a corpus), the frequent ones counted exactly, and the merges learned from them those of the
// whole count first.
TEST(Tokenizer, WordCountsHoldAtMostTheirBoundAndKeepTheFrequentWords) {
  WordCounts bounded(64), whole;
  std::string text;
  for (int i = 0; i < 3000; ++i) text += " the cat sat x" + std::to_string(i * 7919 % 100003);
  for (WordCounts* w : {&bounded, &whole}) {
    std::string_view rest(text);
    while (!rest.empty()) {  // (fed in pieces: the bound holds after each)
      const size_t cut = rest.size() > 200 ? stable_prefix(rest.substr(0, 200)) : rest.size();
      w->add(rest.substr(0, cut));
      rest.remove_prefix(cut);
      ASSERT_LE(w->distinct(), w == &bounded ? 64u : SIZE_MAX);
    }
  }
  EXPECT_EQ(whole.dropped_words(), 0u);
  EXPECT_GT(bounded.dropped_words(), 2900u);
  uint64_t held = 0;
  for (const auto& [word, n] : bounded.counts()) held += n;
  EXPECT_EQ(held + bounded.dropped_count(), bounded.total());
  EXPECT_EQ(bounded.total(), whole.total());
  for (const char* w : {" the", " cat", " sat", " x"})
    EXPECT_EQ(bounded.counts().at(w), whole.counts().at(w)) << w;
  const auto merges = [](const WordCounts& w) { return Tokenizer::train_bpe(w, 257 + 8).merges(); };
  EXPECT_EQ(merges(bounded), merges(whole));
  WordCounts again(64);  // (deterministic)
  again.add(text);
  EXPECT_EQ(again.counts(), bounded.counts());
  // A bound too small for the frequent words keeps half of it of them: every word tied at the
  // cut count went (all 8 words met 2,500 times each, for 3 met once).
  WordCounts full(10);
  for (int i = 0; i < 2500; ++i) full.add(" aa bb cc dd ee ff gg hh");
  full.add(" x1 x2 x3");
  size_t kept = 0;
  for (const char* w : {" aa", " bb", " cc", " dd", " ee", " ff", " gg", " hh"})
    kept += full.counts().count(w) && full.counts().at(w) == 2500;
  EXPECT_EQ(kept, 5u);
}

TEST(Tokenizer, SavedAndLoadedAlikeAndBadFilesNamed) {
  Dir d;
  const Tokenizer t = trained(400);
  t.save(d / "tok.json");
  EXPECT_EQ(Tokenizer::load(d / "tok.json").merges(), t.merges());
  auto refused = [&](const std::string& body, const std::string& why) {
    write(d / "bad.json", body);
    try {
      Tokenizer::load(d / "bad.json");
      ADD_FAILURE() << "accepted: " << body;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
    }
  };
  refused("not json", "is not JSON: parse error at line 1, column 2");  // (no library tag)
  refused("{}", "not a troupe tokenizer");
  refused(R"({"format":"troupe-tokenizer","version":2,"merges":[]})", "unknown version");
  refused(R"({"format":"troupe-tokenizer","version":1,"vocab":258,"merges":[[256,1]]})",
          "not yet defined");
  refused(R"({"format":"troupe-tokenizer","version":1,"vocab":300,"merges":[[1,2]]})", "make 258");
  refused(R"({"format":"troupe-tokenizer","version":1,"vocab":258,"merges":[[1,"x"]]})",
          "not a pair of ids");
  // Each merge of the last piece with itself doubles it: 40 of them would ask for 2^41 bytes.
  std::string doubling =
      R"({"format":"troupe-tokenizer","version":1,"vocab":297,"merges":[[97,97])";
  for (int i = 0; i < 39; ++i)
    doubling += ",[" + std::to_string(256 + i) + "," + std::to_string(256 + i) + "]";
  refused(doubling + "]}", "merge 6 makes a piece of 128 bytes, longer than a word (64)");
  EXPECT_THROW(Tokenizer::load(d / "absent.json"), std::invalid_argument);
  // A FIFO (its read would block forever) or a directory: named, not read.
  ASSERT_EQ(::mkfifo((d / "fifo.json").c_str(), 0600), 0);
  fs::create_directories(d / "dir.json");
  for (const char* name : {"fifo.json", "dir.json"}) try {
      Tokenizer::load(d / name);
      ADD_FAILURE() << name << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
    }
  std::string out;
  const uint32_t bad = 400;
  EXPECT_THROW(t.decode(&bad, 1, out), std::invalid_argument);
}

TEST(Permutation, IsABijectionAtAnySizeAndDependsOnSeedAndEpoch) {
  for (uint64_t n : {1, 2, 3, 7, 64, 1000, 65537}) {
    Permutation p(n, 5, 0);
    std::vector<bool> seen(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      ASSERT_LT(v, n);
      ASSERT_FALSE(seen[v]) << "n " << n << " value " << v << " twice";
      seen[v] = true;
    }
  }
  size_t same_epoch = 0, same_seed = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_epoch += Permutation(1000, 5, 0)(i) == Permutation(1000, 5, 1)(i);
    same_seed += Permutation(1000, 5, 0)(i) == Permutation(1000, 6, 0)(i);
  }
  EXPECT_LT(same_epoch, 20u);
  EXPECT_LT(same_seed, 20u);
}

// A data set of the given ids (one document), written as prepare writes one.
void make_set(const std::string& dir, const std::vector<uint32_t>& ids, const Tokenizer& t,
              uint64_t shard_tokens) {
  fs::create_directories(dir);
  ShardWriter w(dir, 2, shard_tokens);
  w.add_document(ids, t.end_of_document());
  auto shards = w.finish();
  t.save(dir + "/" + kTokenizerFile);
  std::string list;
  for (const auto& s : shards)
    list += (list.empty() ? "" : ",") + std::string("{\"file\":\"") + s.file + "\",\"fnv1a64\":\"" +
            fnv1a64_hex(s.checksum) + "\",\"tokens\":" + std::to_string(s.tokens) + "}";
  write(dir + "/" + kManifestFile,
        "{\"format\":\"troupe-tokens\",\"version\":1,\"vocab\":" + std::to_string(t.vocab_size()) +
            ",\"token_bytes\":2,\"tokens\":" + std::to_string(w.tokens()) + ",\"shards\":[" + list +
            "]}");
}

TEST(TokenShards, ReadAcrossShardsAndEveryDefectNamed) {
  Dir d;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1000; ++i) ids.push_back(i % 256);
  make_set(d / "s", ids, Tokenizer::bytes(), 97);  // 11 shards, the last partial
  auto t = TokenShards::open(d / "s");
  ASSERT_EQ(t->tokens(), 1001u);
  std::vector<int32_t> got(300);
  t->read(90, 300, got.data());
  for (size_t i = 0; i < 300; ++i) ASSERT_EQ(got[i], int32_t((90 + i) % 256));
  int32_t last;
  t->read(1000, 1, &last);
  EXPECT_EQ(last, 256) << "the end-of-document id";
  EXPECT_THROW(t->read(1000, 2, got.data()), std::out_of_range);

  auto refused = [&](const std::string& dir, const std::string& why) {
    try {
      TokenShards::open(dir);
      ADD_FAILURE() << "accepted " << dir;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  refused(d / "absent", "cannot be read");
  fs::create_directories(d / "empty");
  refused(d / "empty", "has no manifest.json");
  fs::copy(d / "s", d / "truncated");
  fs::resize_file(d / "truncated/tokens-00003.bin", 10);
  refused(d / "truncated", "tokens-00003.bin has 10 bytes");
  fs::copy(d / "s", d / "other_tokenizer");
  trained(300).save(d / "other_tokenizer/tokenizer.json");
  refused(d / "other_tokenizer", "is not its tokenizer's");
  fs::copy(d / "s", d / "garbled");
  write(d / "garbled/manifest.json", "{\"format\":\"troupe-tokens\",\"version\":1}");
  refused(d / "garbled", "manifest.json");
  // Counts that wrap (2^63 + 97 tokens of 2 bytes are 194 bytes modulo 2^64), are negative, are
  // of another type or are cut down to a valid one: refused naming the field, never read past a
  // shard's end.
  const std::string good = [&] {
    std::ifstream in(d / "s/manifest.json");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  auto edited = [&](const std::string& name, const std::string& from, const std::string& to) {
    fs::copy(d / "s", d / name);
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    write(d / (name + "/manifest.json"), text);
  };
  edited("wraps", "\"tokens\":97}", "\"tokens\":9223372036854775905}");
  refused(d / "wraps", "\"tokens\" is not an integer from 0 to");
  edited("negative", "\"tokens\":97}", "\"tokens\":-97}");
  refused(d / "negative", "\"tokens\" is not an integer");
  edited("width", "\"token_bytes\":2", "\"token_bytes\":4294967298");
  refused(d / "width", "\"token_bytes\" is not an integer from 0 to 4");
  edited("vocab", "\"vocab\":", "\"vocab\":1e300,\"was\":");
  refused(d / "vocab", "\"vocab\" is not an integer");
  edited("shard", "\"shards\":[", "\"shards\":[7,");
  refused(d / "shard", "a shard has no \"file\"");
  // A shard changed after it was prepared (its size kept): the id outside the vocabulary is
  // named, with its file and place, when it is read.
  fs::copy(d / "s", d / "changed");
  {
    std::fstream f(d / "changed/tokens-00002.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.write("\xff\xff", 2);
  }
  auto changed = TokenShards::open(d / "changed");
  try {
    changed->read(180, 40, got.data());
    ADD_FAILURE() << "read a changed shard";
  } catch (const DamagedData& e) {
    EXPECT_NE(std::string(e.what()).find("tokens-00002.bin: id 65535 at token 5 is outside"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(changed->read(0, 150, got.data()));  // (the shards before it)

  // Every shard read whole against the manifest's checksum: a change inside the vocabulary too
  // (which no read notices), a manifest without checksums, and one with a malformed checksum.
  EXPECT_TRUE(t->verify(3).empty());
  const std::vector<std::string> out_of_vocab = changed->verify(1);
  ASSERT_EQ(out_of_vocab.size(), 1u);
  EXPECT_EQ(out_of_vocab[0].find("tokens-00002.bin: its bytes are not those prepared (FNV-1a "), 0u)
      << out_of_vocab[0];
  fs::copy(d / "s", d / "swapped");
  {
    std::fstream f(d / "swapped/tokens-00009.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("\x41\x00", 2);  // ('A': an id of the vocabulary)
  }
  auto swapped = TokenShards::open(d / "swapped");
  EXPECT_NO_THROW(swapped->read(0, 1001, std::vector<int32_t>(1001).data()));
  const std::vector<std::string> in_vocab = swapped->verify(4);
  ASSERT_EQ(in_vocab.size(), 1u);
  EXPECT_NE(in_vocab[0].find("tokens-00009.bin: its bytes are not those prepared"),
            std::string::npos)
      << in_vocab[0];
  // The changed shard with its checksum forged to match: its id outside the vocabulary is named.
  fs::copy(d / "changed", d / "forged");
  const std::string bytes = read(d / "forged/tokens-00002.bin");
  const std::string original = read(d / "s/tokens-00002.bin");
  const std::string old_sum = fnv1a64_hex(fnv1a64(original.data(), original.size()));
  std::string manifest = read(d / "forged/manifest.json");
  ASSERT_NE(manifest.find(old_sum), std::string::npos);
  manifest.replace(manifest.find(old_sum), 16, fnv1a64_hex(fnv1a64(bytes.data(), bytes.size())));
  write(d / "forged/manifest.json", manifest);
  const std::vector<std::string> forged = TokenShards::open(d / "forged")->verify(2);
  ASSERT_EQ(forged.size(), 1u);
  EXPECT_EQ(forged[0], "tokens-00002.bin: id 65535 at token 5 is outside the vocabulary of 257")
      << forged[0];
  edited("unsummed", ",\"fnv1a64\":\"", ",\"was\":\"");
  const std::vector<std::string> unsummed = TokenShards::open(d / "unsummed")->verify(2);
  ASSERT_EQ(unsummed.size(), 1u);
  EXPECT_NE(unsummed[0].find("tokens-00000.bin: the manifest gives no checksum"), std::string::npos)
      << unsummed[0];
  edited("malformed", "\"fnv1a64\":\"", "\"fnv1a64\":\"X");
  refused(d / "malformed", "tokens-00000.bin: its \"fnv1a64\" is not 16 lowercase hex digits");
}

// A shard cut short while a job reads it (it was mapped: the read was SIGBUS, a crash) is named
// with its file and where it ends now, by a read and by verify.
TEST(TokenShards, AShardCutShortWhileOpenIsNamedNotACrash) {
  Dir d;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1000; ++i) ids.push_back(i % 256);
  make_set(d / "s", ids, Tokenizer::bytes(), 97);  // shard 2: tokens 194 to 290, 194 bytes
  auto t = TokenShards::open(d / "s");
  EXPECT_EQ(TokenShards::open(d / "s/"), t)  // (one descriptor a shard, in a process)
      << "a data set open in the process is opened again";
  fs::resize_file(d / "s/tokens-00002.bin", 10);
  std::vector<int32_t> got(300);
  EXPECT_NO_THROW(t->read(0, 194, got.data()));
  EXPECT_NO_THROW(t->read(190, 9, got.data()));  // (its first 10 bytes are still there)
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(got[i], int32_t((190 + i) % 256));
  try {
    t->read(190, 10, got.data());
    ADD_FAILURE() << "read past the end of a shard cut short";
  } catch (const DamagedData& e) {
    EXPECT_NE(std::string(e.what()).find("/tokens-00002.bin: cut short since it was opened: it "
                                         "ends at byte 10, not 194"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(t->verify(2), std::vector<std::string>{"tokens-00002.bin: cut short since it was "
                                                   "opened: it ends at byte 10, not 194"});
  // Read past its new end: where it ends, not where the read began (byte 112 was said).
  try {
    t->read(250, 5, got.data());
    ADD_FAILURE() << "read past the end of a shard cut short";
  } catch (const DamagedData& e) {
    EXPECT_NE(std::string(e.what()).find("it ends at byte 10, not 194"), std::string::npos)
        << e.what();
  }
}

size_t open_descriptors() {
  return size_t(std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator()));
}

// A set of more shards than it keeps open (each kept a descriptor: a set of tens of thousands
// could not be opened, "Too many open files") is read and verified whole, with at most
// kMostOpenShards files open; a shard opened again is checked to be the file first opened.
TEST(TokenShards, ASetOfMoreShardsThanItKeepsOpenIsReadAndAReplacedShardNamed) {
  Dir d;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1000; ++i) ids.push_back(i % 256);
  make_set(d / "s", ids, Tokenizer::bytes(), 3);  // 334 shards
  const size_t before = open_descriptors();
  auto t = TokenShards::open(d / "s");
  ASSERT_EQ(t->shards(), 334u);
  EXPECT_LE(open_descriptors(), before + kMostOpenShards);
  std::mt19937 rng(5);
  std::vector<int32_t> got(20);
  for (int k = 0; k < 2000; ++k) {
    const uint64_t at = rng() % 980;
    t->read(at, 20, got.data());
    for (size_t i = 0; i < 20; ++i) ASSERT_EQ(got[i], int32_t((at + i) % 256)) << at + i;
  }
  EXPECT_TRUE(t->verify(3).empty());
  EXPECT_LE(open_descriptors(), before + kMostOpenShards);
  for (uint64_t at = 30; at < 990; at += 3) t->read(at, 1, got.data());  // (shard 0 closed)
  write(d / "copy", read(d / "s/tokens-00000.bin"));  // (the same bytes, another file)
  fs::rename(d / "copy", d / "s/tokens-00000.bin");
  fs::remove(d / "s/tokens-00001.bin");
  // Written again in place, its size kept (as a file that took a freed inode's number is: the
  // same device and inode were taken for the same file, and its new bytes read).
  write(d / "s/tokens-00002.bin", std::string(6, '\0'));
  for (const auto& [at, why] : std::vector<std::pair<uint64_t, std::string>>{
           {0, "tokens-00000.bin: replaced or changed since it was opened"},
           {3, "tokens-00001.bin: gone since it was opened"},
           {6, "tokens-00002.bin: replaced or changed since it was opened"}})
    try {
      t->read(at, 1, got.data());
      ADD_FAILURE() << "read a shard " << why;
    } catch (const DamagedData& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
}

TEST(TokenData, WindowsInAGlobalOrderEachOncePerEpoch) {
  Dir d;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1600; ++i) ids.push_back(i % 251);
  make_set(d / "s", ids, Tokenizer::bytes(), 1 << 20);
  const size_t T = 16;
  TokenData data({{d / "s", 1.0}}, T, 3);
  ASSERT_EQ(data.windows(), 100u);  // (1601 - 1) / 16
  std::vector<float> in(T);
  std::vector<int32_t> tg(T);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::set<uint64_t> seen;
    for (uint64_t p = epoch * 100; p < (epoch + 1) * 100; ++p) seen.insert(data.locate(p).window);
    EXPECT_EQ(seen.size(), 100u) << "epoch " << epoch;
  }
  EXPECT_NE(data.locate(0).window, data.locate(100).window) << "each epoch shuffles anew";
  data.fill(42, in.data(), tg.data());
  const uint64_t w = data.locate(42).window;
  for (size_t t = 0; t < T; ++t) {
    EXPECT_EQ(in[t], float((w * T + t) % 251));
    EXPECT_EQ(tg[t], int32_t((w * T + t + 1) % 251)) << "targets: the next tokens";
  }
  EXPECT_EQ(TokenData({{d / "s", 1.0}}, T, 3).locate(77).window, data.locate(77).window);
  EXPECT_EQ(TokenData({{d / "s", 1.0}}, 1600, 3).windows(), 1u);
  EXPECT_THROW(TokenData({{d / "s", 1.0}}, 1601, 3), std::invalid_argument)
      << "fewer tokens than a window";
}

TEST(TokenData, AHeldOutTailIsNeverTrainedOn) {
  Dir d;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1600; ++i) ids.push_back(i % 251);
  make_set(d / "s", ids, Tokenizer::bytes(), 1 << 20);
  TokenData data({{d / "s", 1.0}}, 16, 3, 0.1);
  EXPECT_EQ(data.windows(), 90u);
  EXPECT_EQ(data.eval_windows(), 10u);
  for (uint64_t p = 0; p < 900; ++p) ASSERT_LT(data.locate(p).window, 90u);
  std::vector<float> in(16);
  std::vector<int32_t> tg(16);
  data.fill_eval(3, in.data(), tg.data());
  EXPECT_EQ(in[0], float((93 * 16) % 251)) << "evaluation window 3 is window 93";
  EXPECT_THROW(data.fill_eval(10, in.data(), tg.data()), std::out_of_range);
  TokenData all({{d / "s", 1.0}}, 16, 3, 1.0);
  EXPECT_EQ(all.eval_windows(), 100u);
  EXPECT_THROW(all.fill(0, in.data(), tg.data()), std::logic_error);
}

TEST(TokenData, AMixtureKeepsItsProportionsAndVisitsEachSetsWindowsOnce) {
  Dir d;
  for (const char* name : {"a", "b", "c"})
    make_set(d / name, std::vector<uint32_t>(5000, 65), Tokenizer::bytes(), 1 << 20);
  TokenData mix({{d / "a", 0.5}, {d / "b", 0.3}, {d / "c", 0.2}}, 10, 9);
  std::map<size_t, std::vector<uint64_t>> by_set;
  for (uint64_t p = 0; p < 10000; ++p) {
    const auto at = mix.locate(p);
    by_set[at.set].push_back(at.window);
  }
  EXPECT_NEAR(double(by_set[0].size()) / 10000, 0.5, 0.01);
  EXPECT_NEAR(double(by_set[1].size()) / 10000, 0.3, 0.01);
  EXPECT_NEAR(double(by_set[2].size()) / 10000, 0.2, 0.01);
  // Set c (500 windows) got 2000 positions: 4 whole epochs, each a permutation, so every
  // window appears exactly 4 times.
  std::map<uint64_t, int> times;
  for (uint64_t w : by_set[2]) ++times[w];
  EXPECT_EQ(times.size(), 500u);
  for (auto [w, n] : times) EXPECT_EQ(n, 4) << "window " << w;
  // The first 1000 positions interleave the sets (not 500 a's, then b's).
  size_t changes = 0;
  for (uint64_t p = 1; p < 1000; ++p) changes += mix.locate(p).set != mix.locate(p - 1).set;
  EXPECT_GT(changes, 300u);
  EXPECT_THROW(TokenData({{d / "a", 1.0}, {d / "b", 0.0001}}, 10, 9), std::invalid_argument);
  // 1 in 1501 would have been given 1 in 1000 (50% more than asked): below the block's grain.
  try {
    TokenData({{d / "a", 1500}, {d / "b", 1}}, 10, 9);
    ADD_FAILURE() << "1 in 1501 taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("its weight 1 is 0.666 in 1000 of the mixture's total "
                                         "1501, below the 1 in 1000"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(TokenData({{d / "a", 999}, {d / "b", 1}}, 10, 9));
  make_set(d / "other", std::vector<uint32_t>(5000, 65), trained(300), 1 << 20);
  EXPECT_THROW(TokenData({{d / "a", 1.0}, {d / "other", 1.0}}, 10, 9), std::invalid_argument)
      << "one vocabulary";
  // The same vocabulary size from other merges is another tokenizer.
  WordCounts apache;
  apache.add(read("/usr/share/common-licenses/Apache-2.0"));
  make_set(d / "p", std::vector<uint32_t>(5000, 65), trained(300), 1 << 20);
  make_set(d / "q", std::vector<uint32_t>(5000, 65), Tokenizer::train_bpe(apache, 300), 1 << 20);
  EXPECT_NO_THROW(TokenData({{d / "p", 1.0}, {d / "other", 1.0}}, 10, 9));
  EXPECT_THROW(TokenData({{d / "p", 1.0}, {d / "q", 1.0}}, 10, 9), std::invalid_argument);
}

TEST(Prepare, TextDirectoriesAndJsonLinesWithBadDocumentsSkippedAndCounted) {
  Dir d;
  write(d / "in/a.txt", "hello world\n");
  write(d / "in/sub/b.txt", "second document\n");
  write(d / "in/sub/binary.dat", std::string("ELF\0\1\2", 6));
  write(d / "in/sub/latin1.txt", "caf\xe9\n");
  write(d / "in/empty.txt", "");
  write(d / "in/docs.jsonl",
        "{\"text\": \"from json \\u00e9\"}\nnot json\n{\"other\": 1}\n\n{\"text\": \"again\"}\n");
  // JSON lines named .json (as many data sets are) are JSON lines, not text with their keys.
  write(d / "in/sub/lines.json", "  {\"text\": \"named json\"}\n");
  write(d / "in/sub/marked.JSON", "\xEF\xBB\xBF{\"text\": \"marked\"}\n");  // (a BOM, upper case)
  const PrepareSummary s = prepare({{d / "in"}, d / "out", "bpe", 300});
  EXPECT_EQ(s.files, 8u);
  EXPECT_EQ(s.documents, 6u);
  EXPECT_EQ(s.skipped_binary, 1u);
  EXPECT_EQ(s.skipped_invalid_utf8, 1u);
  EXPECT_EQ(s.skipped_empty, 1u);
  EXPECT_EQ(s.skipped_bad_json, 2u);
  EXPECT_NE(s.first_skipped.find("docs.jsonl:2"), std::string::npos) << s.first_skipped;
  // Where a text is not UTF-8 (a file dropped whole for one byte: what to mend).
  EXPECT_EQ(first_invalid_utf8("caf\xe9\n", 5), 3u);
  EXPECT_EQ(first_invalid_utf8("caf\xc3\xa9", 5), 5u);
  EXPECT_EQ(first_invalid_utf8("0123456789\xff", 11), 10u);
  auto t = TokenShards::open(d / "out");
  EXPECT_EQ(t->tokens(), s.tokens);
  std::vector<int32_t> ids(t->tokens());
  t->read(0, ids.size(), ids.data());
  Tokenizer tok = Tokenizer::load(d / "out/tokenizer.json");
  std::string text;
  for (int32_t id : ids) {
    const uint32_t u = uint32_t(id);
    tok.decode(&u, 1, text);
  }
  EXPECT_EQ(text,
            "hello world\n<|endoftext|>from json \xc3\xa9<|endoftext|>again<|endoftext|>"
            "second document\n<|endoftext|>named json<|endoftext|>marked<|endoftext|>");
  EXPECT_EQ(read(d / "out/documents.bin").size(), 6u * 8);
  for (const auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find("partial"), std::string::npos);
}

// documents.bin, the index of where each document begins, is checked by verify too: its count
// against the manifest's and the shards' end-of-document ids, its order, and its checksum.
TEST(Prepare, VerifyNamesADamagedDocumentIndex) {
  Dir d;
  write(d / "in/a.txt", "first document\n");
  write(d / "in/b.txt", "the second one\n");
  write(d / "in/c.txt", "and a third\n");
  prepare({{d / "in"}, d / "s"});
  EXPECT_TRUE(TokenShards::open(d / "s")->verify(2).empty());
  const std::string index = read(d / "s/documents.bin");
  ASSERT_EQ(index.size(), 24u);
  const auto verified = [&](const std::string& name, const std::string& bytes,
                            const std::string& manifest_from = "", const std::string& to = "") {
    fs::copy(d / "s", d / name);
    write(d / name + "/documents.bin", bytes);
    if (!manifest_from.empty()) {
      std::string m = read(d / "s/manifest.json");
      EXPECT_NE(m.find(manifest_from), std::string::npos) << m;
      m.replace(m.find(manifest_from), manifest_from.size(), to);
      write(d / name + "/manifest.json", m);
    }
    const std::vector<std::string> found = TokenShards::open(d / name)->verify(2);
    return found.size() == 1 ? found[0] : "(" + std::to_string(found.size()) + " lines)";
  };
  std::string shifted = index;
  shifted[8] = char(shifted[8] + 1);  // (still in order: only the checksum tells)
  EXPECT_EQ(verified("shifted", shifted).find("documents.bin: its bytes are not those prepared"),
            0u);
  EXPECT_EQ(verified("odd", index.substr(0, 12)), "documents.bin: 12 bytes, not 8 a document");
  EXPECT_EQ(verified("short", index.substr(0, 16)),
            "documents.bin: 2 documents; the manifest says 3");
  EXPECT_EQ(verified("uncounted", index.substr(0, 16), "\"documents\":", "\"was\":"),
            "documents.bin: 2 documents; the token files end 3 (end-of-document ids)");
  std::string unordered = index;
  unordered.replace(8, 8, std::string(8, '\0'));
  EXPECT_EQ(verified("unordered", unordered, "\"documents_fnv1a64\":", "\"was\":")
                .find("documents.bin: document 1 begins at token 0, not past 0 and before "),
            0u);
  fs::copy(d / "s", d / "gone");
  fs::remove(d / "gone/documents.bin");
  EXPECT_EQ(TokenShards::open(d / "gone")->verify(1),
            std::vector<std::string>{"documents.bin: cannot be opened: No such file or directory"});
  EXPECT_TRUE(TokenShards::open(d / "gone")->verify(1, TokenShards::kShardsOnly).empty())
      << "troupe run refused a set whose token files, all it reads, are sound";
}

// A file the process cannot open for want of descriptors is not called damaged (troupe data
// verify said "exit 1: damaged" under a low ulimit, and a user would have prepared it again): the
// check throws Unreadable, and the same set checked with descriptors free is sound.
TEST(Prepare, VerifyOutOfDescriptorsIsNotDamage) {
  Dir d;
  write(d / "in/a.txt", "first document\n");
  prepare({{d / "in"}, d / "s"});
  fs::copy(d / "s", d / "damaged");
  std::string shard = read(d / "damaged/tokens-00000.bin");
  shard[0] = char(shard[0] ^ 1);
  write(d / "damaged/tokens-00000.bin", shard);
  // verify(1) with every descriptor the process may open taken: what it says, or threw.
  const auto starved = [](const TokenShards& t) {
    rlimit was{};
    EXPECT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
    rlimit low = was;  // (a few more than open now, then every one of them taken)
    low.rlim_cur = std::min<rlim_t>(
        was.rlim_cur, std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {}) + 8);
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    std::vector<int> held;
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) held.push_back(fd);
    const int error = errno;
    std::string what;
    try {
      const std::vector<std::string> found = t.verify(1);
      what = "said: " + (found.empty() ? std::string("sound") : found[0]);
    } catch (const Unreadable& e) {
      what = std::string("threw: ") + e.what();
    }
    for (int fd : held) ::close(fd);
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &was), 0);
    EXPECT_EQ(error, EMFILE);
    return what;
  };
  const auto t = TokenShards::open(d / "s");
  const std::string sound = starved(*t);
  EXPECT_NE(sound.find("threw: " + d / "s/documents.bin" +
                       ": cannot be opened here: Too many open files"),
            std::string::npos)
      << sound;
  EXPECT_TRUE(t->verify(1).empty());
  // Damage found is said all the same (it was thrown away for the file not read).
  const std::string damaged = starved(*TokenShards::open(d / "damaged"));
  EXPECT_EQ(damaged.find("said: tokens-00000.bin: its bytes are not those prepared"), 0u)
      << damaged;
}

// A text file larger than whole_text_bytes is read in pieces (it was held whole: memory grew with
// the file): the same shards, tokenizer and counts as whole, and the same reason to skip one.
TEST(Prepare, ALargeTextFileIsReadInPiecesWithTheSameResult) {
  Dir d;
  std::string big;
  while (big.size() < (9 << 20)) big += kGpl + " caf\xc3\xa9 \xe2\x82\xac ";
  write(d / "in/big.txt", big);
  std::string across(1 << 20, 'a');  // (a character across the first two reads)
  across.back() = '\xc3';
  write(d / "in/across.txt", across + "\xa9 end");
  write(d / "in/small.txt", "a small one");
  PrepareSummary s[2];
  for (int pieces : {0, 1}) {
    PrepareOptions o{{d / "in"}, d / ("out" + std::to_string(pieces)), "bpe", 300};
    o.whole_text_bytes = pieces ? 1 : UINT64_MAX;
    s[pieces] = prepare(o);
  }
  EXPECT_EQ(s[0].documents, 3u);
  EXPECT_EQ(s[1].documents, s[0].documents);
  EXPECT_EQ(s[1].bytes, s[0].bytes);
  EXPECT_EQ(s[1].tokens, s[0].tokens);
  EXPECT_EQ(s[1].skipped_invalid_utf8, 0u);
  for (const auto& e : fs::directory_iterator(d / "out0")) {
    if (e.path().filename() == "manifest.json") continue;
    EXPECT_TRUE(read(e.path()) == read(d / "out1/" + e.path().filename().string())) << e.path();
  }
  const auto skipped_for = [&](const std::string& name, const std::string& body) {
    write(d / ("bad/" + name), body);
    PrepareOptions o{{d / ("bad/" + name)}, d / ("no-" + name)};
    o.whole_text_bytes = 1;
    try {
      prepare(o);
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      return what.substr(what.find(name) + name.size());
    }
    return std::string("(prepared)");
  };
  across[5] = '\0';
  EXPECT_EQ(skipped_for("nul.txt", across), " (binary: a NUL byte))");
  across[5] = 'a';
  EXPECT_EQ(skipped_for("cut.txt", across + "x"), " (invalid UTF-8 at byte 1048575 of its text))");
  EXPECT_EQ(skipped_for("end.txt", std::string(2 << 20, 'a') + "\xe2\x82"),
            " (invalid UTF-8 at byte 2097152 of its text))");
  EXPECT_EQ(skipped_for("ff.txt", std::string(3 << 20, 'a') + "\xff\xff\xff\xff\xff"),
            " (invalid UTF-8 at byte 3145728 of its text))");
}

TEST(Prepare, BadInputsAreRefusedAndLeaveNoDataSet) {
  Dir d;
  write(d / "bin/x.dat", std::string("\0\0\0", 3));
  write(d / "bin/y.txt", "");
  write(d / "text.txt", "some text");
  auto refused = [&](PrepareOptions o, const std::string& why) {
    try {
      prepare(o);
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    if (o.out != d / "exists") {
      EXPECT_FALSE(fs::exists(o.out)) << o.out;
    }
  };
  refused({{d / "absent"}, d / "o1"}, "does not exist");
  refused({{d / "bin"}, d / "o2"}, "no text in the inputs");
  fs::create_directories(d / "exists");
  refused({{d / "text.txt"}, d / "exists"}, "exists");
  refused({{d / "text.txt"}, d / "o3", "bpe", 100}, "N >= 258");
  // (257 ids leave no merge: it made the byte tokenizer, said only in the summary)
  refused({{d / "text.txt"}, d / "o3", "bpe", 257}, "257 ids are --tokenizer byte), not 257");
  refused({{d / "text.txt"}, d / "o4", "word"}, "byte or bpe");
  refused({{"/dev/null"}, d / "o5"}, "neither a file nor a directory");
  write(d / "array.json", "\n[{\"text\": \"a\"}]");
  refused({{d / "array.json"}, d / "o7"},
          "holds a JSON array: troupe data prepare reads JSON lines");
  refused({{d / "text.txt"}, d / "text.txt/o8"}, "text.txt is not a directory");
  refused({{d / "text.txt"}, d / "text.txt/deeper/o9"}, "text.txt is not a directory");
  // (Its missing parents are made.)
  prepare({{d / "text.txt"}, d / "new/deeper/o10"});
  EXPECT_TRUE(fs::exists(d / "new/deeper/o10/manifest.json"));
  {  // (relative, none of it there yet: made in the working directory; it said "rel is not a
     // directory")
    const fs::path cwd = fs::current_path();
    fs::current_path(d.path);
    EXPECT_NO_THROW(prepare({{"text.txt"}, "rel/deeper/o11"}));
    fs::current_path(cwd);
    EXPECT_TRUE(fs::exists(d / "rel/deeper/o11/manifest.json"));
  }
  // A trailing slash names the same directory (its partial is a sibling, not inside it).
  prepare({{d / "text.txt"}, d / "slash/"});
  EXPECT_TRUE(fs::exists(d / "slash/manifest.json"));
  EXPECT_THROW(prepare({{d / "text.txt"}, d / "slash"}), std::invalid_argument);
  // A dead prepare's partial directory goes.
  fs::create_directories(d / "o6.partial-999999999");
  prepare({{d / "text.txt"}, d / "o6"});
  EXPECT_TRUE(fs::exists(d / "o6/manifest.json"));
  EXPECT_FALSE(fs::exists(d / "o6.partial-999999999"));
}

std::vector<int32_t> stream_of(const std::string& dir) {
  auto t = TokenShards::open(dir);
  std::vector<int32_t> ids(t->tokens());
  t->read(0, ids.size(), ids.data());
  return ids;
}

TEST(Import, LlmcTokenFilesBecomeTheSameDocumentsAndDecode) {
  Dir d;
  // LLaMA 3's layout (uint32 ids; a tokenizer of version 2: the end of text given, not the last
  // id).
  llmc::write_tokenizer(d / "tok.bin", llmc::pieces(300, 260), 2, 260);
  // Documents begin with the end of text in llm.c's files; one goes on into the next file, and
  // runs of none (two ends in a row, a file of one end) are no documents.
  llmc::write_tokens(d / "a.bin", {7, 8, 260, 9, 10, 11}, llmc::kLlama3);
  llmc::write_tokens(d / "b.bin", {12, 260, 260, 13, 299}, llmc::kLlama3);
  llmc::write_tokens(d / "c.bin", {260});  // (GPT-2's uint16 ids: files of both in one set)
  ImportOptions o{{d / "a.bin", d / "b.bin", d / "c.bin"}, d / "tok.bin", d / "set", 4};
  const ImportSummary s = import_llmc(o);
  EXPECT_EQ(s.documents, 3u);
  EXPECT_EQ(s.tokens, 11u);
  EXPECT_EQ(s.vocab, 300u);
  EXPECT_EQ(s.end_of_document, 260u);
  EXPECT_EQ(stream_of(d / "set"),
            (std::vector<int32_t>{7, 8, 260, 9, 10, 11, 12, 260, 13, 299, 260}));
  auto set = TokenShards::open(d / "set");
  EXPECT_EQ(set->shards(), 3u);  // (--shard-tokens 4)
  EXPECT_EQ(set->end_of_document(), 260u);
  EXPECT_EQ(set->token_bytes(), 2u);  // (300 ids fit 16 bits whatever the files' width)
  EXPECT_EQ(set->verify(2), std::vector<std::string>{}) << "its documents counted at id 260";
  // The tokenizer decodes as llm.c's does, saved and loaded alike, and refuses to encode.
  const Tokenizer tok = Tokenizer::load(d / "set/tokenizer.json");
  EXPECT_EQ(tok.kind(), "table");
  EXPECT_EQ(tok.fingerprint(), load_llmc_tokenizer(d / "tok.bin").fingerprint());
  std::string text;
  const uint32_t ids[] = {'h', 'i', 299, 260, 0};
  tok.decode(ids, 5, text);
  EXPECT_EQ(text, std::string("hip299<|endoftext|>\0", 20));
  Tokenizer copy = tok;
  try {
    copy.encode("hi");
    ADD_FAILURE() << "a table encoded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("llm.c's tokenizer, version 2) only decodes"),
              std::string::npos)
        << e.what();
  }
  // Nor does prepare encode with it.
  write(d / "text.txt", "some text");
  PrepareOptions p{{d / "text.txt"}, d / "prepared"};
  p.tokenizer_from = d / "set";
  EXPECT_THROW(prepare(p), std::invalid_argument);
  EXPECT_FALSE(fs::exists(d / "prepared"));
}

TEST(Import, GptTwosTokenizerOfVersionOneEndsDocumentsAt50256) {
  Dir d;
  llmc::write_tokenizer(d / "gpt2.bin", llmc::pieces(50257, 50256), 1, 0);
  llmc::write_tokens(d / "t.bin", {50256, 1000, 50255, 50256, 3});
  const ImportSummary s = import_llmc({{d / "t.bin"}, d / "gpt2.bin", d / "set"});
  EXPECT_EQ(s.vocab, 50257u);
  EXPECT_EQ(s.end_of_document, 50256u);
  EXPECT_EQ(stream_of(d / "set"), (std::vector<int32_t>{1000, 50255, 50256, 3, 50256}));
  EXPECT_EQ(TokenShards::open(d / "set")->token_bytes(), 2u);
}

TEST(Import, BadFilesAreNamedAndLeaveNoDataSet) {
  Dir d;
  llmc::write_tokenizer(d / "tok.bin", llmc::pieces(300, 299), 2, 299);
  llmc::write_tokens(d / "a.bin", {299, 1, 2});
  auto refused = [&](std::vector<std::string> inputs, const std::string& tokenizer,
                     const std::string& why) {
    try {
      import_llmc({inputs, tokenizer, d / "out"});
      ADD_FAILURE() << "accepted: " << why;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(d / "out")) << why;
    for (const auto& e : fs::directory_iterator(d.path))
      EXPECT_EQ(e.path().string().find(".partial-"), std::string::npos) << e.path();
  };
  refused({d / "tok.bin"}, d / "tok.bin",
          "tok.bin: is not an llm.c token file (it begins "
          "with 20240328, not 20240520 or 20240801): it is a tokenizer file");
  refused({d / "a.bin"}, d / "a.bin", "a.bin: is not llm.c's tokenizer file");
  refused({d / "absent.bin"}, d / "tok.bin", "absent.bin: No such file or directory");
  refused({d.path}, d / "tok.bin", "is not a regular file");
  refused({d / "a.bin", d / "a.bin"}, d / "tok.bin", "a.bin: is named twice");
  write(d / "short.bin", read(d / "a.bin").substr(0, 1000));
  refused({d / "short.bin"}, d / "tok.bin", "short.bin: is shorter than llm.c's header");
  write(d / "cut.bin", read(d / "a.bin").substr(0, 1024 + 5));
  refused({d / "cut.bin"}, d / "tok.bin",
          "cut.bin: holds 1029 bytes; its header says 3 ids of 2 "
          "bytes: 1030 (cut short?)");
  llmc::write_tokens(d / "v2.bin", {1}, llmc::kGpt2, 2);  // (llm.c writes no such file)
  refused({d / "v2.bin"}, d / "tok.bin", "v2.bin: has version 2 of 20240520");
  llmc::write_tokens(d / "v1.bin", {1}, llmc::kLlama3, 1);
  refused({d / "v1.bin"}, d / "tok.bin", "v1.bin: has version 1 of 20240801");
  std::string negative = read(d / "a.bin");
  negative.replace(8, 4, "\xfb\xff\xff\xff");  // (an int32 of -5)
  write(d / "negative.bin", negative);
  refused({d / "negative.bin"}, d / "tok.bin", "negative.bin: says it holds -5 ids");
  // An id outside the vocabulary in the second file: its place named, nothing written.
  llmc::write_tokens(d / "b.bin", {299, 300, 1});
  refused({d / "a.bin", d / "b.bin"}, d / "tok.bin",
          "b.bin: id 300 at token 1 is outside the 300 ids of --tokenizer");
  llmc::write_tokens(d / "ends.bin", {299, 299});
  refused({d / "ends.bin"}, d / "tok.bin", "no document in the inputs");
  // Tokenizer files: GPT-2's version with another vocabulary, an end of text outside, an empty
  // piece, cut short, bytes after the last piece.
  llmc::write_tokenizer(d / "v1.bin", llmc::pieces(300, 299), 1, 0);
  refused({d / "a.bin"}, d / "v1.bin", "version 1 is GPT-2's tokenizer of 50257 ids");
  llmc::write_tokenizer(d / "eot.bin", llmc::pieces(300, 299), 2, 300);
  refused({d / "a.bin"}, d / "eot.bin", "its end-of-text id 300 is outside its 300 ids");
  auto empty = llmc::pieces(300, 299);
  empty[5].clear();
  llmc::write_tokenizer(d / "empty.bin", empty, 2, 299);
  refused({d / "a.bin"}, d / "empty.bin", "piece 5 is empty");
  const std::string whole = read(d / "tok.bin");
  write(d / "cut-tok.bin", whole.substr(0, whole.size() - 3));
  refused({d / "a.bin"}, d / "cut-tok.bin", "ends within piece 299 of 300 (cut short?)");
  write(d / "more-tok.bin", whole + "x");
  refused({d / "a.bin"}, d / "more-tok.bin", "has bytes after its 300 pieces");
  // And a table's tokenizer.json damaged.
  import_llmc({{d / "a.bin"}, d / "tok.bin", d / "set"});
  std::string json = read(d / "set/tokenizer.json");
  json.replace(json.find("\"01\""), 4, "\"0x\"");
  write(d / "bad.json", json);
  try {
    Tokenizer::load(d / "bad.json");
    ADD_FAILURE() << "a bad piece loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("piece 1 is not a string of hex digits"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace troupe::data
