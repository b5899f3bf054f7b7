#include "nncomm/transports/join.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "nncomm/core/broken_process.hpp"
#include "nncomm/core/wait.hpp"
#include "nncomm/observability/config.hpp"
#include "nncomm/transports/mpi_transport.hpp"

namespace nncomm {

namespace {

// Messages on the scope's own communicator. MPI keeps each sender's
// messages in order, so a leaver has every description a rank sent it
// before that rank's own notice.
enum Tag : int { kNotice = 1, kHeader = 2, kError = 3 };

// Descriptions kept per transport: more than a rank can run ahead of one
// that left in operations that complete without it.
constexpr size_t kHistory = 4096;

struct Track {
  std::deque<std::pair<uint64_t, ShadowOp>> history; // (seq, op)
  std::map<int, uint64_t> sent; // world rank that left -> last seq sent
};

// What a rank that left said: how many steps it trained, and how many
// operations it made on each transport and in all.
struct Notice {
  uint64_t steps = 0;
  uint64_t trained = 0;
  std::unordered_map<uint64_t, uint64_t> seqs; // transport id -> seq
};

struct Send {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<uint64_t> words;
  std::string text;
};

// Descriptions a leaver received: transport id -> seq -> sender -> op.
using Inbox = std::map<uint64_t, std::map<uint64_t, std::map<int, ShadowOp>>>;

struct Scope {
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<int> world;              // world rank of each rank of comm
  std::unordered_map<int, int> rank_of; // world rank -> rank of comm
  int me = 0;                           // this rank's world rank
  bool throw_early = false;
  bool left = false; // this rank
  std::map<int, Notice> notices; // by world rank; this rank's once it left
  std::unordered_map<const MpiTransport *, Track> tracks;
  std::list<Send> sends; // a list: MPI holds their buffers' addresses
  Inbox inbox;
  std::string error;
};

std::mutex mutex; // guards what follows
std::atomic<bool> scope_open{false};
Scope *scope = nullptr;

// Leavers find the transports of an operation by id on their own thread,
// where the waits they make poll too.
thread_local bool leaving = false;
// Incomplete tests of this thread's waits since it last took messages: a
// wait takes them every kPollEvery tests, so that a small collective's
// spinning tests stay as quick as outside a scope. An operation that needs
// a rank that left never completes without them, so its wait soon does.
thread_local unsigned tests_unpolled = 0;
constexpr unsigned kPollEvery = 16;

void put(std::vector<uint64_t> *w, const std::vector<uint64_t> &v) {
  w->push_back(v.size());
  w->insert(w->end(), v.begin(), v.end());
}

std::vector<uint64_t> encode(uint64_t id, uint64_t seq, const ShadowOp &op) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &op.scale, sizeof scale_bits);
  std::vector<uint64_t> w = {id,
                             seq,
                             static_cast<uint64_t>(op.kind),
                             static_cast<uint64_t>(op.dt),
                             op.count,
                             static_cast<uint64_t>(op.root),
                             static_cast<uint64_t>(op.divisor),
                             scale_bits,
                             op.fingerprint,
                             op.phase};
  put(&w, op.counts);
  put(&w, op.from);
  return w;
}

bool take(const std::vector<uint64_t> &w, size_t *at,
          std::vector<uint64_t> *v) {
  if (*at >= w.size() || w.size() - *at - 1 < w[*at])
    return false;
  v->assign(w.begin() + *at + 1, w.begin() + *at + 1 + w[*at]);
  *at += 1 + w[*at];
  return true;
}

bool decode(const std::vector<uint64_t> &w, uint64_t *id, uint64_t *seq,
            ShadowOp *op) {
  if (w.size() < 10)
    return false;
  *id = w[0];
  *seq = w[1];
  op->kind = static_cast<ShadowOp::Kind>(w[2]);
  op->dt = static_cast<DType>(w[3]);
  op->count = w[4];
  op->root = static_cast<int>(w[5]);
  op->divisor = static_cast<int>(w[6]);
  const uint32_t scale_bits = static_cast<uint32_t>(w[7]);
  std::memcpy(&op->scale, &scale_bits, sizeof scale_bits);
  op->fingerprint = w[8];
  op->phase = w[9];
  size_t at = 10;
  return take(w, &at, &op->counts) && take(w, &at, &op->from);
}

// Below: with `mutex` held and a scope open.

void fail(const std::string &why) {
  if (scope->error.empty())
    scope->error = why;
}

void send(int world_rank, Tag tag, std::vector<uint64_t> words,
          std::string text = {}) {
  scope->sends.emplace_back();
  Send &s = scope->sends.back();
  s.words = std::move(words);
  s.text = std::move(text);
  const int dest = scope->rank_of.at(world_rank);
  const int err =
      tag == kError
          ? MPI_Isend(s.text.data(), static_cast<int>(s.text.size()),
                      MPI_CHAR, dest, tag, scope->comm, &s.request)
          : MPI_Isend(s.words.data(), static_cast<int>(s.words.size()),
                      MPI_UINT64_T, dest, tag, scope->comm, &s.request);
  if (err != MPI_SUCCESS) {
    s.request = MPI_REQUEST_NULL;
    fail("a message of comm.join() could not be sent (MPI_Isend failed)");
  }
}

void reap_sends() {
  for (auto it = scope->sends.begin(); it != scope->sends.end();) {
    int done = 1;
    if (it->request != MPI_REQUEST_NULL)
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? scope->sends.erase(it) : std::next(it);
  }
}

Notice notice_of(const std::vector<uint64_t> &w) {
  Notice n;
  if (w.size() < 2)
    return n;
  n.steps = w[0];
  n.trained = w[1];
  for (size_t i = 2; i + 1 < w.size(); i += 2)
    n.seqs[w[i]] = w[i + 1];
  return n;
}

// Takes every message that has come.
void receive() {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, scope->comm, &flag,
                   &status) != MPI_SUCCESS) {
      fail("comm.join() could not take its messages (MPI_Iprobe failed)");
      return;
    }
    if (!flag)
      return;
    const int from = scope->world[status.MPI_SOURCE];
    if (status.MPI_TAG == kError) {
      int length = 0;
      MPI_Get_count(&status, MPI_CHAR, &length);
      std::string text(static_cast<size_t>(std::max(length, 0)), '\0');
      MPI_Recv(&text[0], length, MPI_CHAR, status.MPI_SOURCE, kError,
               scope->comm, MPI_STATUS_IGNORE);
      fail(text);
      continue;
    }
    int length = 0;
    MPI_Get_count(&status, MPI_UINT64_T, &length);
    std::vector<uint64_t> w(static_cast<size_t>(std::max(length, 0)));
    MPI_Recv(w.data(), length, MPI_UINT64_T, status.MPI_SOURCE,
             status.MPI_TAG, scope->comm, MPI_STATUS_IGNORE);
    if (status.MPI_TAG == kNotice) {
      scope->notices[from] = notice_of(w);
      continue;
    }
    uint64_t id = 0, seq = 0;
    ShadowOp op;
    if (status.MPI_TAG != kHeader || !scope->left ||
        !decode(w, &id, &seq, &op)) {
      fail("comm.join() received a message it cannot read from world rank " +
           std::to_string(from));
      continue;
    }
    scope->inbox[id][seq][from] = std::move(op);
  }
}

// Sends every rank that left the operations it has not been sent on each
// transport it is a member of.
void catch_up() {
  if (scope->notices.empty() || scope->left)
    return;
  for (auto &entry : scope->tracks) {
    const MpiTransport &t = *entry.first;
    Track &track = entry.second;
    for (int r : t.world_ranks()) {
      auto n = scope->notices.find(r);
      if (n == scope->notices.end())
        continue;
      auto sent = track.sent.find(r);
      if (sent == track.sent.end()) {
        auto seq = n->second.seqs.find(t.id());
        sent = track.sent
                   .emplace(r, seq != n->second.seqs.end() ? seq->second
                                                           : t.created_seq())
                   .first;
      }
      if (sent->second >= t.seq())
        continue;
      if (track.history.empty() ||
          track.history.front().first > sent->second + 1) {
        fail("world rank " + std::to_string(r) +
             " left comm.join() more than " + std::to_string(kHistory) +
             " operations behind world rank " + std::to_string(scope->me) +
             "; it cannot take part in them");
        return;
      }
      for (const auto &op : track.history) {
        if (op.first > sent->second)
          send(r, kHeader, encode(t.id(), op.first, op.second));
      }
      sent->second = t.seq();
    }
  }
}

Status failure() {
  const std::string why = scope->error;
  mark_broken(why, true);
  return Status::Communicator(why);
}

// The operation `seq` on `t` as this leaver makes it, once every rank
// still training in it described it: `*ready` false while one has not.
Status merge(const MpiTransport &t, uint64_t seq,
             const std::map<int, ShadowOp> &described, bool *ready,
             ShadowOp *op) {
  *ready = false;
  const std::vector<int> &members = t.world_ranks();
  const ShadowOp *first = nullptr;
  for (int r : members) {
    if (r == scope->me)
      continue;
    auto n = scope->notices.find(r);
    if (n != scope->notices.end()) {
      auto s = n->second.seqs.find(t.id());
      if (s == n->second.seqs.end() || s->second < seq)
        continue; // left before this operation: a leaver in it too
    }
    auto d = described.find(r);
    if (d == described.end())
      return Status::Ok();
    if (first == nullptr) {
      first = &d->second;
    } else if (d->second.fingerprint != first->fingerprint ||
               d->second.kind != first->kind ||
               d->second.phase != first->phase) {
      return Status::InvalidArgument(
          "the ranks still training in comm.join() make different calls "
          "(world ranks " + std::to_string(r) + " and others)");
    }
  }
  if (first == nullptr)
    return Status::InvalidArgument("an operation of comm.join() has no rank "
                                   "still training in it");
  *op = *first;
  if (op->kind == ShadowOp::Kind::kAlltoallv) {
    // Per rank: what it sends to this one, and receives from it.
    const size_t me = static_cast<size_t>(t.rank());
    op->counts.assign(members.size(), 0);
    op->from.assign(members.size(), 0);
    for (size_t q = 0; q < members.size(); ++q) {
      auto d = described.find(members[q]);
      if (d == described.end() || d->second.counts.size() <= me ||
          d->second.from.size() <= me)
        continue;
      op->counts[q] = d->second.counts[me];
      op->from[q] = d->second.from[me];
    }
  }
  *ready = true;
  return Status::Ok();
}

} // namespace

bool Join::open() { return scope_open.load(std::memory_order_relaxed); }

void Join::withdraw(MpiTransport *t) {
  // Under the scope's lock, so that a transport Join found by id
  // (MpiTransport::find, before the transport left the registry) lives
  // while Join holds the lock.
  std::lock_guard<std::mutex> lock(mutex);
  if (scope != nullptr)
    scope->tracks.erase(t);
}

Status Join::Open(MpiTransport &root, bool throw_early) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (scope != nullptr)
      return Status::InvalidArgument("comm.join() is already open: join "
                                     "scopes do not nest");
  }
  // Every rank is here after the (bounded) barrier, so MPI_Comm_dup, which
  // has no bound, cannot wait for one that never comes.
  OperationLabel label("opening comm.join()");
  NNCOMM_RETURN_IF_ERROR(root.barrier());
  std::unique_ptr<Scope> opened(new Scope);
  if (MPI_Comm_dup(root.comm_, &opened->comm) != MPI_SUCCESS)
    return Status::Transport("MPI_Comm_dup failed opening comm.join()");
  opened->world = root.world_ranks();
  for (size_t r = 0; r < opened->world.size(); ++r)
    opened->rank_of[opened->world[r]] = static_cast<int>(r);
  opened->me = opened->world[root.rank()];
  opened->throw_early = throw_early;
  std::lock_guard<std::mutex> lock(mutex);
  scope = opened.release();
  scope_open = true;
  return Status::Ok();
}

Status Join::note(MpiTransport &t, const ShadowOp &op) {
  if (leaving)
    return Status::Ok();
  std::lock_guard<std::mutex> lock(mutex);
  // A transport being made has no ranks yet; a rank that left describes
  // nothing. Ranks that left are learnt of in waits (poll()): one that
  // this operation needs makes its wait poll.
  if (scope == nullptr || scope->left || t.world_ranks().empty())
    return Status::Ok();
  Track &track = scope->tracks[&t];
  track.history.emplace_back(t.seq(), op);
  if (track.history.size() > kHistory)
    track.history.pop_front();
  catch_up();
  return scope->error.empty() ? Status::Ok() : failure();
}

Status Join::poll() {
  if (leaving || ++tests_unpolled < kPollEvery)
    return Status::Ok();
  tests_unpolled = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (scope == nullptr)
    return Status::Ok();
  receive();
  catch_up();
  reap_sends();
  return scope->error.empty() ? Status::Ok() : failure();
}

bool Join::left(int world_rank) {
  std::lock_guard<std::mutex> lock(mutex);
  return scope != nullptr && scope->notices.count(world_rank) != 0;
}

Status Join::Count(MpiTransport &root, int *training) {
  int64_t total = 0;
  WorkPtr round;
  OperationLabel label("counting the ranks still training in comm.join()");
  NNCOMM_RETURN_IF_ERROR(root.start_count(1, &total, &round));
  NNCOMM_RETURN_IF_ERROR(wait_for(*round, root.rank() == 0, nullptr));
  *training = static_cast<int>(total);
  return Status::Ok();
}

Status Join::Leave(uint64_t steps, int *last, bool *terminated) {
  using clock = std::chrono::steady_clock;
  *terminated = false;
  struct Flight {
    WorkPtr work;
    ShadowOp::Kind kind;
  };
  std::map<uint64_t, Flight> flights;                // by transport id
  std::map<uint64_t, std::vector<char>> scratches;   // by transport id
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (scope == nullptr)
      return Status::InvalidArgument("comm.join() is not open");
    receive();
    // What this rank owes the ranks that left before it goes out first.
    catch_up();
    if (!scope->error.empty())
      return failure();
    Notice mine;
    mine.steps = steps;
    std::vector<uint64_t> words = {steps, 0};
    MpiTransport::for_each([&](MpiTransport &t) {
      mine.seqs[t.id()] = t.seq();
      mine.trained += t.seq();
      words.push_back(t.id());
      words.push_back(t.seq());
    });
    words[1] = mine.trained;
    for (int r : scope->world) {
      if (r != scope->me)
        send(r, kNotice, words);
    }
    scope->left = true;
    scope->notices[scope->me] = std::move(mine);
  }
  leaving = true;
  struct Reset {
    ~Reset() { leaving = false; }
  } reset;
  const double timeout = config::timeout_seconds();
  auto last_progress = clock::now();
  auto next_signals = last_progress + std::chrono::milliseconds(100);
  for (;;) {
    bool progress = false;
    std::vector<std::pair<MpiTransport *, ShadowOp>> to_start;
    {
      std::lock_guard<std::mutex> lock(mutex);
      receive();
      reap_sends();
      for (auto &entry : scope->inbox) {
        if (entry.second.empty() || flights.count(entry.first))
          continue;
        MpiTransport *t = MpiTransport::find(entry.first);
        if (t == nullptr) {
          fail("world rank " + std::to_string(scope->me) +
               " left comm.join() and has no communicator for an operation "
               "the ranks still training make (one made after it left?)");
          break;
        }
        const uint64_t next = t->seq() + 1;
        auto op = entry.second.begin();
        if (op->first != next) {
          if (op->first < next)
            fail("comm.join() was sent an operation twice");
          continue;
        }
        ShadowOp merged;
        bool ready = false;
        Status status = merge(*t, next, op->second, &ready, &merged);
        if (!status.ok()) {
          fail(status.message());
          break;
        }
        if (ready) {
          to_start.emplace_back(t, std::move(merged));
          entry.second.erase(op);
        }
      }
      if (scope->error.empty() && flights.empty() && to_start.empty() &&
          scope->notices.size() == scope->world.size())
        break; // every rank has left, and nothing is owed
      if (!scope->error.empty()) {
        // Every other rank learns why, instead of waiting for this one.
        for (int r : scope->world) {
          if (r != scope->me)
            send(r, kError, {}, scope->error);
        }
        return failure();
      }
    }
    for (auto &s : to_start) {
      Flight flight;
      flight.kind = s.second.kind;
      Status status = s.first->start_shadow(
          s.second, &scratches[s.first->id()], &flight.work);
      if (!status.ok()) {
        Abandon(status.message());
        mark_broken(status.message(), true);
        return status;
      }
      flights[s.first->id()] = std::move(flight);
      progress = true;
    }
    for (auto it = flights.begin(); it != flights.end();) {
      bool done = false;
      NNCOMM_RETURN_IF_ERROR(it->second.work->test(&done));
      if (!done) {
        ++it;
        continue;
      }
      progress = true;
      const bool counted = it->second.kind == ShadowOp::Kind::kCount;
      it = flights.erase(it);
      std::lock_guard<std::mutex> lock(mutex);
      if (counted && scope->throw_early) {
        // The ranks still training found this one gone in this round and
        // raise; so does this one.
        *terminated = true;
        *last = scope->rank_of.at(scope->me);
        return Status::Ok();
      }
    }
    const auto now = clock::now();
    if (progress) {
      last_progress = now;
    } else if (timeout > 0 &&
               std::chrono::duration<double>(now - last_progress).count() >=
                   timeout) {
      const std::string why =
          "world rank " + std::to_string(scope->me) +
          " left comm.join() and waited " + std::to_string(int(timeout)) +
          " s (NNCOMM_TIMEOUT) for the ranks still training, which neither "
          "communicated nor left";
      Abandon(why);
      mark_broken(why, true);
      return Status::Communicator(why);
    }
    if (now >= next_signals) {
      next_signals = now + std::chrono::milliseconds(100);
      if (interrupted()) {
        mark_broken("comm.join() was interrupted", false);
        return Status::Interrupted();
      }
    }
    // A leaver must answer soon (the others wait for it in every
    // operation), but must not take the core of a rank still training.
    if (!flights.empty() ||
        now - last_progress < std::chrono::microseconds(200))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::lock_guard<std::mutex> lock(mutex);
  // The last to leave trained longest; those that left together trained
  // alike: the lowest of them.
  int best = scope->me;
  const auto longer = [](const Notice &a, const Notice &b) {
    return a.steps != b.steps ? a.steps > b.steps : a.trained > b.trained;
  };
  for (const auto &n : scope->notices) {
    const Notice &b = scope->notices[best];
    if (longer(n.second, b) || (!longer(b, n.second) && n.first < best))
      best = n.first;
  }
  *last = scope->rank_of.at(best);
  return Status::Ok();
}

void Join::Abandon(const std::string &why) {
  std::lock_guard<std::mutex> lock(mutex);
  if (scope == nullptr)
    return;
  for (int r : scope->world) {
    if (r != scope->me)
      send(r, kError, {}, why);
  }
}

void Join::Close() {
  std::lock_guard<std::mutex> lock(mutex);
  if (scope == nullptr)
    return;
  scope_open = false;
  MpiTransport::for_each([](MpiTransport &t) { t.forget_calls(); });
  // Every message was taken, except errors to ranks that stopped taking
  // them: a second for those, then they are dropped.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!scope->sends.empty() && std::chrono::steady_clock::now() < until)
    reap_sends();
  for (Send &s : scope->sends) {
    MPI_Cancel(&s.request);
    MPI_Request_free(&s.request);
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized)
    MPI_Comm_free(&scope->comm);
  delete scope;
  scope = nullptr;
}

} // namespace nncomm
