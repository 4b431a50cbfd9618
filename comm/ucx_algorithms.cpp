#include "comm/ucx_algorithms.h"

#include <algorithm>
#include <cstring>

#include "comm/reduce.h"

namespace troupe::comm::ucx {

Segments split_evenly(size_t count, int n) {
  Segments sg;
  size_t base = count / size_t(n), rem = count % size_t(n), at = 0;
  for (int i = 0; i < n; ++i) {
    size_t c = base + (size_t(i) < rem ? 1 : 0);
    sg.offset.push_back(at);
    sg.count.push_back(c);
    at += c;
  }
  return sg;
}

Segments equal_segments(size_t count, int n) {
  Segments sg;
  for (int i = 0; i < n; ++i) {
    sg.offset.push_back(size_t(i) * count);
    sg.count.push_back(count);
  }
  return sg;
}

void allreduce_recursive_doubling(Group& g, uint8_t* buf, size_t count, DataType t, uint64_t s,
                                  Millis to) {
  const size_t bytes = count * element_size(t);
  const int n = g.size(), me = g.rank;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  uint8_t* tmp = g.scratch_of(bytes);
  std::vector<Request> reqs;
  auto exchange = [&](std::vector<Request> pending) { g.link->wait_all(pending, to); };
  if (me >= p2) {  // fold into rank - p2, get the result back
    const int partner = me - p2;
    exchange({g.isend(partner, buf, bytes, g.tag(kCollective, s, me, 0)),
              g.irecv(buf, bytes, g.tag(kCollective, s, partner, 1))});
    return;
  }
  if (me < extra) {
    exchange({g.irecv(tmp, bytes, g.tag(kCollective, s, me + p2, 0))});
    reduce_sum(buf, tmp, count, t);
  }
  uint64_t round = 2;
  for (int mask = 1; mask < p2; mask <<= 1, ++round) {
    const int partner = me ^ mask;
    exchange({g.irecv(tmp, bytes, g.tag(kCollective, s, partner, round)),
              g.isend(partner, buf, bytes, g.tag(kCollective, s, me, round))});
    // Lower rank's data first on both sides: the same sum, bitwise, everywhere.
    if (partner < me) {
      reduce_sum(tmp, buf, count, t);
      std::memcpy(buf, tmp, bytes);
    } else {
      reduce_sum(buf, tmp, count, t);
    }
  }
  if (me < extra) exchange({g.isend(me + p2, buf, bytes, g.tag(kCollective, s, me, 1))});
}

void ring_reduce_scatter(Group& g, uint8_t* buf, const Segments& sg, DataType t, int off,
                         uint64_t s, Millis to) {
  const size_t es = element_size(t);
  const size_t chunk = std::max<size_t>(1, g.link->options().segment_bytes / es);
  const size_t window = std::max<size_t>(1, g.link->options().window);
  const int me = g.rank, next = g.mod(me + 1), prev = g.mod(me - 1);
  const size_t max_seg = *std::max_element(sg.count.begin(), sg.count.end());
  uint8_t* tmp = g.scratch_of(std::min(max_seg, chunk * window) * es);
  for (int step = 0; step < g.size() - 1; ++step) {
    const int send_seg = g.mod(me - step + off), recv_seg = g.mod(me - step - 1 + off);
    const size_t send_chunks = (sg.count[size_t(send_seg)] + chunk - 1) / chunk;
    const size_t recv_chunks = (sg.count[size_t(recv_seg)] + chunk - 1) / chunk;
    auto slot = [&](size_t c) { return (uint64_t(step) << 12) + c; };
    std::vector<Request> sends, recvs(recv_chunks);
    for (size_t c = 0; c < send_chunks; ++c) {
      size_t at = c * chunk, len = std::min(chunk, sg.count[size_t(send_seg)] - at);
      sends.push_back(g.isend(next, buf + (sg.offset[size_t(send_seg)] + at) * es, len * es,
                              g.tag(kCollective, s, me, slot(c))));
    }
    auto post = [&](size_t c) {
      size_t at = c * chunk, len = std::min(chunk, sg.count[size_t(recv_seg)] - at);
      recvs[c] =
          g.irecv(tmp + (c % window) * chunk * es, len * es, g.tag(kCollective, s, prev, slot(c)));
    };
    for (size_t c = 0; c < std::min(window, recv_chunks); ++c) post(c);
    for (size_t c = 0; c < recv_chunks; ++c) {
      try {
        g.link->wait(recvs, c, c + 1, to);
      } catch (...) {
        g.link->fail_pending(sends);
      }
      size_t at = c * chunk, len = std::min(chunk, sg.count[size_t(recv_seg)] - at);
      reduce_sum(buf + (sg.offset[size_t(recv_seg)] + at) * es, tmp + (c % window) * chunk * es,
                 len, t);
      if (c + window < recv_chunks) post(c + window);
    }
    g.link->wait_all(sends, to);
  }
}

void ring_allgather(Group& g, uint8_t* buf, const Segments& sg, size_t es, int off, uint64_t s,
                    uint64_t phase, Millis to) {
  const int me = g.rank, next = g.mod(me + 1), prev = g.mod(me - 1);
  const size_t chunk = std::max<size_t>(1, g.link->options().segment_bytes / es);
  for (int step = 0; step < g.size() - 1; ++step) {
    const size_t send_seg = size_t(g.mod(me - step + off)),
                 recv_seg = size_t(g.mod(me - step - 1 + off));
    auto slot = [&](size_t c) { return phase + (uint64_t(step) << 12) + c; };
    std::vector<Request> reqs;
    for (size_t at = 0, c = 0; at < sg.count[recv_seg]; at += chunk, ++c) {
      size_t len = std::min(chunk, sg.count[recv_seg] - at);
      reqs.push_back(g.irecv(buf + (sg.offset[recv_seg] + at) * es, len * es,
                             g.tag(kCollective, s, prev, slot(c))));
    }
    for (size_t at = 0, c = 0; at < sg.count[send_seg]; at += chunk, ++c) {
      size_t len = std::min(chunk, sg.count[send_seg] - at);
      reqs.push_back(g.isend(next, buf + (sg.offset[send_seg] + at) * es, len * es,
                             g.tag(kCollective, s, me, slot(c))));
    }
    g.link->wait_all(reqs, to);
  }
}

void broadcast_binomial(Group& g, uint8_t* buf, size_t bytes, int root, uint64_t s, Millis to) {
  const int n = g.size(), vr = g.mod(g.rank - root);
  auto real = [&](int v) { return g.mod(v + root); };
  int mask = 1;
  std::vector<Request> reqs;
  while (mask < n) {
    if (vr & mask) {
      reqs.push_back(g.irecv(buf, bytes, g.tag(kCollective, s, real(vr - mask), 0)));
      g.link->wait_all(reqs, to);
      reqs.clear();
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n)
      reqs.push_back(g.isend(real(vr + mask), buf, bytes, g.tag(kCollective, s, g.rank, 0)));
  g.link->wait_all(reqs, to);
}

void barrier_dissemination(Group& g, uint64_t s, Millis to) {
  uint8_t out_byte = 1, in_byte = 0;
  uint64_t round = 0;
  for (int dist = 1; dist < g.size(); dist <<= 1, ++round) {
    std::vector<Request> reqs{
        g.irecv(&in_byte, 1, g.tag(kCollective, s, g.mod(g.rank - dist), round)),
        g.isend(g.mod(g.rank + dist), &out_byte, 1, g.tag(kCollective, s, g.rank, round))};
    g.link->wait_all(reqs, to);
  }
}

}  // namespace troupe::comm::ucx
