#include <ucp/api/ucp.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>
namespace wucx {
inline void check(ucs_status_t s, const char* what) {
    if (s != UCS_OK) throw std::runtime_error(std::string(what) + ": " + ucs_status_string(s));
}
inline ucp_context_h makeContext(const char* tls /* "tcp", or nullptr = env/default */) {
    ucp_config_t* cfg = nullptr;
    check(ucp_config_read(nullptr, nullptr, &cfg), "ucp_config_read");        // reads UCX_* env
    if (tls) check(ucp_config_modify(cfg, "TLS", tls), "ucp_config_modify(TLS)");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    p.features   = UCP_FEATURE_AM | UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    p.name       = "weft";
    ucp_context_h ctx = nullptr;
    ucs_status_t s = ucp_init(&p, cfg, &ctx);
    ucp_config_release(cfg);
    check(s, "ucp_init");
    return ctx;
}
inline ucp_worker_h makeWorker(ucp_context_h ctx) {                 // one per thread
    ucp_worker_params_t p{};
    p.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    p.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_h w = nullptr;
    check(ucp_worker_create(ctx, &p, &w), "ucp_worker_create");
    return w;
}
inline std::vector<char> workerAddress(ucp_worker_h w, bool netOnly) {  // bytes for the coordinator
    ucp_worker_attr_t a{};
    a.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
    a.address_flags = netOnly ? UCP_WORKER_ADDRESS_FLAG_NET_ONLY : 0;  // NET_ONLY: no shm/self
    check(ucp_worker_query(w, &a), "ucp_worker_query");
    std::vector<char> out(reinterpret_cast<char*>(a.address),
                          reinterpret_cast<char*>(a.address) + a.address_length);
    ucp_worker_release_address(w, a.address);
    return out;
}
// Wait for any *_nbx result and free it. The deadline is the only guard against silent peers (§1.5).
inline ucs_status_t wait(ucp_worker_h w, ucs_status_ptr_t req,
                         std::chrono::steady_clock::duration timeout = std::chrono::seconds(60)) {
    if (req == nullptr) return UCS_OK;                               // completed immediately
    if (UCS_PTR_IS_ERR(req)) return UCS_PTR_STATUS(req);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ucs_status_t s;
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        ucp_worker_progress(w);
        if (std::chrono::steady_clock::now() > deadline) {
            ucp_request_cancel(w, req);                              // completes it (CANCELED)
            while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(w);
            s = UCS_ERR_TIMED_OUT;
            break;
        }
    }
    ucp_request_free(req);
    return s;
}
struct Peer { bool dead = false; ucs_status_t why = UCS_OK; ucp_ep_h ep = nullptr; };
inline void onEpError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {  // inside progress: record only
    auto* peer = static_cast<Peer*>(arg);
    peer->dead = true;  peer->why = status;   // CONNECTION_RESET, ENDPOINT_TIMEOUT, NOT_CONNECTED, ...
}
inline ucp_ep_params_t peerParams(Peer* peer) {                     // PEER mode + handler, always
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = onEpError;  p.err_handler.arg = peer;
    return p;
}
inline sockaddr_in ipv4(const char* ip, uint16_t port) {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;  sa.sin_port = htons(port);              // port 0 = ephemeral (listen)
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) throw std::runtime_error("bad IPv4 address");
    return sa;
}
inline ucp_ep_h connectByAddress(ucp_worker_h w, const std::vector<char>& addr, Peer* peer) {
    ucp_ep_params_t p = peerParams(peer);
    p.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    p.address = reinterpret_cast<const ucp_address_t*>(addr.data());
    check(ucp_ep_create(w, &p, &peer->ep), "ucp_ep_create(address)");
    return peer->ep;
}
inline ucp_ep_h connectBySockaddr(ucp_worker_h w, const char* ip, uint16_t port, Peer* peer) {
    const sockaddr_in sa = ipv4(ip, port);
    ucp_ep_params_t p = peerParams(peer);
    p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);  p.sockaddr.addrlen = sizeof sa;
    check(ucp_ep_create(w, &p, &peer->ep), "ucp_ep_create(sockaddr)");
    return peer->ep;
}
struct Listener { ucp_listener_h h = nullptr; std::vector<ucp_conn_request_h> incoming; uint16_t port = 0; };
inline void onConnRequest(ucp_conn_request_h req, void* arg) {
    static_cast<Listener*>(arg)->incoming.push_back(req);           // accept() or ucp_listener_reject()
}
inline void listen(ucp_worker_h w, const char* ip, uint16_t port, Listener* L) {
    const sockaddr_in sa = ipv4(ip, port);
    ucp_listener_params_t p{};
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);  p.sockaddr.addrlen = sizeof sa;
    p.conn_handler.cb = onConnRequest;  p.conn_handler.arg = L;
    check(ucp_listener_create(w, &p, &L->h), "ucp_listener_create");
    ucp_listener_attr_t a{};
    a.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    check(ucp_listener_query(L->h, &a), "ucp_listener_query");
    L->port = ntohs(reinterpret_cast<const sockaddr_in*>(&a.sockaddr)->sin_port);
}
inline ucp_ep_h accept(ucp_worker_h w, ucp_conn_request_h req, Peer* peer) {
    ucp_ep_params_t p = peerParams(peer);
    p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = req;
    check(ucp_ep_create(w, &p, &peer->ep), "ucp_ep_create(conn_request)");
    return peer->ep;
}
inline ucs_status_t closeEp(ucp_worker_h w, ucp_ep_h ep, bool force) {  // FLUSH (0) if healthy
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags        = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    return wait(w, ucp_ep_close_nbx(ep, &p), std::chrono::seconds(10));
}
enum : unsigned { kAmRequest = 1, kAmReply = 2 };
struct RpcHeader { uint64_t callId; uint32_t method; uint32_t payloadKind; };
struct Arrival { RpcHeader hdr{}; void* data = nullptr; size_t length = 0; bool rndv = false;
                 ucp_ep_h replyEp = nullptr; };
struct AmInbox { std::vector<Arrival> queue; };                     // drained after progress returns
inline ucs_status_t onAm(void* arg, const void* header, size_t headerLength, void* data,
                         size_t length, const ucp_am_recv_param_t* param) {
    Arrival a;
    if (headerLength == sizeof(RpcHeader)) std::memcpy(&a.hdr, header, sizeof(RpcHeader));
    a.length  = length;
    a.replyEp = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
    a.rndv    = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;   // data = descriptor
    if (a.rndv || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA)) {    // may be kept
        a.data = data;
        static_cast<AmInbox*>(arg)->queue.push_back(a);
        return UCS_INPROGRESS;      // later: ucp_am_recv_data_nbx (RNDV) / ucp_am_data_release (DATA)
    }
    return UCS_OK;                  // 'data' dies on return (not reached with PERSISTENT_DATA)
}
inline void setHandler(ucp_worker_h w, unsigned id, AmInbox* inbox) {
    ucp_am_handler_param_t p{};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    p.id = id;  p.cb = onAm;  p.arg = inbox;
    p.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    check(ucp_worker_set_am_recv_handler(w, &p), "ucp_worker_set_am_recv_handler");
}
inline ucs_status_t receive(ucp_worker_h w, const Arrival& a, void* dst) {  // dst: a.length bytes
    if (!a.rndv) { std::memcpy(dst, a.data, a.length); ucp_am_data_release(w, a.data); return UCS_OK; }
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype     = ucp_dt_make_contig(1);
    return wait(w, ucp_am_recv_data_nbx(w, a.data, dst, a.length, &p));   // UCP owns desc now
}
// 'hdr' and 'buf' must stay valid until the request completes (no COPY_HEADER flag in 1.13).
inline ucs_status_ptr_t send(ucp_ep_h ep, unsigned id, const RpcHeader* hdr, const void* buf,
                             size_t len, bool wantReplyEp) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
    p.flags        = wantReplyEp ? UCP_AM_SEND_FLAG_REPLY : 0;   // | UCP_AM_SEND_FLAG_EAGER / _RNDV
    p.datatype     = ucp_dt_make_contig(1);
    return ucp_am_send_nbx(ep, id, hdr, sizeof *hdr, buf, len, &p);
}
}  // namespace wucx
