#include "ucx_am.cpp"
#include <algorithm>

namespace wucx {
// tag = [63:48] communicator id | [47:24] collective seq | [23] phase | [22:12] step | [11:0] chunk
inline ucp_tag_t ringTag(uint64_t comm, uint64_t seq, uint64_t phase, uint64_t step, uint64_t chunk) {
    return (comm << 48) | ((seq & 0xFFFFFF) << 24) | (phase << 23) | ((step & 0x7FF) << 12) | (chunk & 0xFFF);
}
struct Seg { size_t off, len; };                       // elements
inline Seg segment(size_t count, int n, int i) {       // balanced split, first count%n get +1
    size_t base = count / n, rem = count % n, ui = static_cast<size_t>(i);
    return {ui * base + std::min(ui, rem), base + (ui < rem ? 1 : 0)};
}

// In-place sum over n ranks; 'right' = ep to rank (rank+1)%n; receives come from (rank-1)%n.
// Unpipelined reference version: one message per step.
inline ucs_status_t ringAllreduce(ucp_worker_h w, ucp_ep_h right, float* data, size_t count,
                                  int rank, int n, uint64_t comm, uint64_t seq,
                                  std::vector<float>& scratch, uint64_t& bytesSent) {
    if (n == 1) return UCS_OK;
    auto mod = [n](int x) { return ((x % n) + n) % n; };
    scratch.resize(segment(count, n, 0).len);
    for (int phase = 0; phase < 2; ++phase) {          // 0 = reduce-scatter, 1 = all-gather
        for (int s = 0; s < n - 1; ++s) {
            const int sendIdx = phase == 0 ? mod(rank - s) : mod(rank + 1 - s);
            const int recvIdx = phase == 0 ? mod(rank - s - 1) : mod(rank - s);
            const Seg so = segment(count, n, sendIdx), ro = segment(count, n, recvIdx);
            float* recvBuf = phase == 0 ? scratch.data() : data + ro.off;  // AG lands in place
            const ucp_tag_t tag = ringTag(comm, seq, phase, s, 0);
            ucp_request_param_t p{};
            p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
            p.datatype     = ucp_dt_make_contig(sizeof(float));
            ucs_status_ptr_t rreq = ucp_tag_recv_nbx(w, recvBuf, ro.len, tag, ~ucp_tag_t(0), &p);
            ucs_status_ptr_t sreq = ucp_tag_send_nbx(right, data + so.off, so.len, tag, &p);
            bytesSent += so.len * sizeof(float);
            const ucs_status_t ss = wait(w, sreq), rs = wait(w, rreq);
            if (ss != UCS_OK) return ss;
            if (rs != UCS_OK) return rs;
            if (phase == 0)
                for (size_t i = 0; i < ro.len; ++i) data[ro.off + i] += scratch[i];
        }
    }
    return UCS_OK;
}
}  // namespace wucx
