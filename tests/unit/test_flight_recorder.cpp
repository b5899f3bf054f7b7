// The flight recorder: a ring keeps the last N operations, in order, with
// their states, labels and call sites; records being rewritten while a dump
// reads them are left out, never written torn; recording off or N = 0
// records nothing; a failed wait writes the record into
// NNCOMM_FLIGHT_RECORDER_DIR.
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "fake_transport.hpp"
#include "nncomm/core/wait.hpp"
#include "nncomm/observability/flight_recorder.hpp"
#include "reference.hpp"

using namespace nncomm;
using namespace unit;

namespace {

// A directory of its own under /tmp.
std::string temporary_directory() {
  char name[] = "/tmp/nncomm-unit-flight-XXXXXX";
  return mkdtemp(name) != nullptr ? name : "";
}

std::string read_file(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every process's recorders, written out; the file's text.
std::string dump_text(const std::string &dir) {
  std::string path;
  CHECK_OK(FlightRecorder::dump(dir, "asked \"by\" the test", &path));
  return read_file(path);
}

// The record lines of a dump: (seq, count) of each, in file order.
std::vector<std::pair<unsigned long long, unsigned long long>>
records(const std::string &text) {
  std::vector<std::pair<unsigned long long, unsigned long long>> found;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    unsigned long long seq = 0, count = 0;
    const size_t at = line.find("{\"seq\": ");
    const size_t counted = line.find("\"count\": ");
    if (at == std::string::npos || counted == std::string::npos)
      continue;
    std::sscanf(line.c_str() + at, "{\"seq\": %llu", &seq);
    std::sscanf(line.c_str() + counted, "\"count\": %llu", &count);
    found.emplace_back(seq, count);
  }
  return found;
}

FlightOp op(size_t count) {
  return {"allreduce", count, DType::kFloat32, 0, 1000 + count};
}

} // namespace

TEST(flight_recorder_keeps_the_last_operations_in_order) {
  const std::string dir = temporary_directory();
  FlightRecorder::set_process(3, 4);
  FlightRecorder ring(8);
  ring.set_group({1, 3});
  for (uint64_t seq = 1; seq <= 13; ++seq) {
    ring.enqueue(seq, op(seq), 0);
    ring.started(seq);
    if (seq != 12)
      ring.completed(seq);
  }
  ring.failed(13);
  ring.completed(2); // long gone from the ring: changes nothing
  const std::string text = dump_text(dir);
  CHECK_CONTAINS(text, "\"rank\": 3, \"world_size\": 4");
  CHECK_CONTAINS(text, "\"reason\": \"asked \\\"by\\\" the test\"");
  CHECK_CONTAINS(text, "\"world_ranks\": [1, 3], \"channel\": 0, "
                       "\"last_seq\": 13");
  const auto kept = records(text);
  CHECK_EQ(kept.size(), size_t(8));
  for (size_t i = 0; i < kept.size(); ++i) {
    CHECK_EQ(kept[i].first, 6 + i);
    CHECK_EQ(kept[i].second, 6 + i);
  }
  CHECK_CONTAINS(text, "\"seq\": 11, \"op\": \"allreduce\", \"call\": null, "
                       "\"phase\": \"operation\", \"count\": 11, \"bytes\": "
                       "44, \"dtype\": \"float32\", \"root\": 0, "
                       "\"fingerprint\": \"00000000000003f3\", \"state\": "
                       "\"completed\"");
  CHECK_CONTAINS(text, "\"seq\": 12, \"op\": \"allreduce\"");
  CHECK(text.find("\"count\": 12, \"bytes\": 48, \"dtype\": \"float32\", "
                  "\"root\": 0, \"fingerprint\": \"00000000000003f4\", "
                  "\"state\": \"started\", ") != std::string::npos);
  CHECK(text.find("\"fingerprint\": \"00000000000003f5\", \"state\": "
                  "\"failed\"") != std::string::npos);
  CHECK_EQ(access((dir + "/nncomm-flight-3.json").c_str(), R_OK), 0);
}

TEST(flight_recorder_records_the_call_and_its_python_line) {
  const std::string dir = temporary_directory();
  FlightRecorder ring(4);
  ring.set_group({0});
  FlightRecorder::set_call_site("train.py:12 in \"step\"");
  {
    OperationLabel label("all_reduce of %zu arrays", 3);
    ring.enqueue(1, {"check", 0, DType::kInt64, 0, 7}, 1);
  }
  FlightRecorder::set_call_site(nullptr);
  ring.enqueue(2, op(5), 0);
  const std::string text = dump_text(dir);
  CHECK_CONTAINS(text, "\"seq\": 1, \"op\": \"check\", \"call\": \"all_reduce "
                       "of 3 arrays\", \"phase\": \"call check\"");
  CHECK_CONTAINS(text, "\"site\": \"train.py:12 in \\\"step\\\"\"}");
  CHECK_CONTAINS(text, "\"state\": \"enqueued\", ");
  CHECK_CONTAINS(text, "\"ended\": null, \"site\": null}");
}

TEST(flight_recorder_numbers_the_rings_of_one_group) {
  FlightRecorder first(2), second(2), other(2);
  first.set_group({0, 1});
  other.set_group({1});
  second.set_group({0, 1});
  const std::string text = dump_text(temporary_directory());
  CHECK_CONTAINS(text, "\"world_ranks\": [0, 1], \"channel\": 0,");
  CHECK_CONTAINS(text, "\"world_ranks\": [0, 1], \"channel\": 1,");
  CHECK_CONTAINS(text, "\"world_ranks\": [1], \"channel\": 0,");
}

TEST(flight_recorder_off_or_empty_records_nothing) {
  FlightRecorder none(0), ring(4);
  none.set_group({0});
  ring.set_group({1});
  none.enqueue(1, op(1), 0);
  none.completed(1);
  FlightRecorder::set_recording(false);
  ring.enqueue(1, op(1), 0);
  ring.completed(1);
  FlightRecorder::set_recording(true);
  ring.enqueue(2, op(2), 0);
  const auto kept = records(dump_text(temporary_directory()));
  CHECK_EQ(kept.size(), size_t(1));
  CHECK_EQ(kept[0].first, 2ull);
}

TEST(flight_recorder_dump_beside_the_writer_leaves_out_torn_records) {
  // One thread records as fast as it can, each record's count its seq,
  // while dumps are taken: every record written is whole.
  const std::string dir = temporary_directory();
  FlightRecorder ring(16);
  ring.set_group({0});
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t seq = 1; !stop.load(); ++seq) {
      ring.enqueue(seq, op(seq), 0);
      ring.completed(seq);
    }
  });
  size_t seen = 0;
  for (int dump = 0; dump < 200; ++dump) {
    const auto kept = records(dump_text(dir));
    seen += kept.size();
    for (size_t i = 0; i < kept.size(); ++i) {
      CHECK_EQ(kept[i].second, kept[i].first);
      if (i > 0)
        CHECK(kept[i].first > kept[i - 1].first);
    }
  }
  stop = true;
  writer.join();
  CHECK(seen > 0);
}

TEST(flight_recorder_written_when_a_wait_fails) {
  const std::string dir = temporary_directory();
  // Read once per process, at first use: this test's.
  setenv("NNCOMM_FLIGHT_RECORDER_DIR", dir.c_str(), 1);
  FlightRecorder::set_process(0, 2);
  FlightRecorder ring(4);
  ring.set_group({0, 1});
  ring.enqueue(1, op(4), 0);
  FakeWorld world(2);
  auto transport = world.transport(0);
  Array buf(DType::kFloat32, 4);
  WorkPtr work;
  CHECK_OK(transport->start_allreduce(buf.data(), buf.count(), buf.dtype(),
                                      1.0f, 1, &work));
  const std::atomic<bool> cancel{true};
  Polling polling;
  polling.cancel = &cancel;
  CHECK_EQ(wait_for(*work, false, &polling).code(),
           StatusCode::kCommunicator);
  const std::string text = read_file(dir + "/nncomm-flight-0.json");
  CHECK_CONTAINS(text, "\"reason\": \"a wait for other ranks was cancelled\"");
  CHECK_CONTAINS(text, "\"seq\": 1, \"op\": \"allreduce\"");
}
