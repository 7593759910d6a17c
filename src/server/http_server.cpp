#include "server/http_server.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstring>
#include <string>

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include "core/logging.h"
#include "core/version.h"

namespace gptoss::server {
namespace {

// The header block's limits (HttpServerOptions::max_header_bytes, header_timeout).
struct HeaderLimits {
    size_t max_bytes = size_t{64} << 10;
    std::chrono::seconds timeout{30};
    std::string cors_origin;  // (empty: no CORS header on the answers given here)
};

// One connection's byte stream, kept across its keep-alive requests (httplib 0.11 makes a new one a request and
// drops what it read ahead: pipelined requests lost all but the first). While a request's line and headers are read
// it holds them to the HeaderLimits (httplib bounds each header line, not their count, nor the time they take: a
// client could send gigabytes of header lines, or trickle a line each read timeout forever); past either the
// client gets 431 or 408 and the connection ends.
class ConnectionStream final : public httplib::Stream {
public:
    ConnectionStream(int fd, std::chrono::microseconds read_timeout, std::chrono::microseconds write_timeout,
                     HeaderLimits limits)
        : fd_(fd), read_timeout_(read_timeout), write_timeout_(write_timeout), limits_(limits) {}

    // A request begins: its header block is counted from here until headers_done().
    void begin_request() {
        in_headers_ = true;
        parsed_ = close_ = chunked_ = false;
        declared_length_ = body_read_ = 0;
        last_[0] = last_[1] = 0;
        header_bytes_ = trailer_bytes_ = 0;
        line_len_ = line_index_ = 0;
        line_colon_ = prev_cr_ = false;
        chunk_ = ChunkState::kSizeLine;
        chunk_left_ = 0;
        chunk_digits_ = 0;
        header_deadline_ = std::chrono::steady_clock::now() + limits_.timeout;
    }
    // httplib parsed the request line and headers: the body (if any) follows, held to a pace of its own (a body
    // trickled a byte a read timeout held a worker forever).
    void headers_done(const httplib::Request& req) {
        in_headers_ = false;
        parsed_ = true;
        chunked_ = req.has_header("Transfer-Encoding");
        const std::string length = req.get_header_value("Content-Length");
        declared_length_ = 0;
        for (char c : length) {
            if (c < '0' || c > '9' || declared_length_ > (int64_t{1} << 50)) {
                declared_length_ = int64_t{1} << 50;  // (httplib answers a bad length; the body is not read)
                break;
            }
            declared_length_ = declared_length_ * 10 + (c - '0');
        }
        body_start_ = std::chrono::steady_clock::now();
    }
    bool parsed() const { return parsed_; }
    // The connection ends after this request's answer (close_after).
    void close_after_response() { close_ = true; }
    // The request's body was not read whole (an answer given without it: its bytes must not be taken for the next
    // request), or came chunked (whose end httplib does not say): the connection must end after the answer.
    bool body_left() const { return parsed_ && (chunked_ || body_read_ < declared_length_); }
    bool closing() const { return close_ || failed_ || !parsed_; }
    // The connection must end (a header block over its limits was answered).
    bool failed() const { return failed_; }
    bool has_buffered() const { return begin_ < end_; }

    bool is_readable() const override { return has_buffered() || wait(POLLIN, read_timeout_); }
    bool is_writable() const override { return !failed_ && wait(POLLOUT, write_timeout_); }

    ssize_t read(char* ptr, size_t size) override {
        for (;;) {
            if (failed_) return -1;
            if (const ssize_t f = fill(); f <= 0) return f;
            if (!parsed_ || in_headers_ || !chunked_ || chunk_ == ChunkState::kDone) return hand_out(ptr, size);
            // A chunked body: its trailer fields are dropped here (httplib 0.11 takes only the empty line after the
            // last chunk, and answered a trailer 400; RFC 9112 §7.1.2 lets a recipient discard them). Nothing handed
            // out (the bytes read were all a trailer's): read on.
            const size_t n = hand_out_chunked(ptr, size);
            if (failed_) return -1;
            if (n > 0) return static_cast<ssize_t>(n);
        }
    }

private:
    // Bytes buffered, reading the socket if none are: 1, or what read() returns when none could be (0: the client
    // closed; -1: a timeout or an error).
    ssize_t fill() {
        if (has_buffered()) return 1;
        const bool in_body = parsed_ && !in_headers_;
        const std::chrono::microseconds wait_for = in_headers_ ? std::min(read_timeout_, header_time_left())
                                                   : in_body   ? std::min(read_timeout_, body_time_left())
                                                               : read_timeout_;
        if (!wait(POLLIN, wait_for)) {
            if (in_headers_ && header_time_left() <= std::chrono::microseconds::zero())
                refuse(408, "the request's headers took longer than " + std::to_string(limits_.timeout.count()) +
                                " s to arrive");
            if (in_body && body_time_left() <= std::chrono::microseconds::zero())
                refuse(408, "the request body arrived too slowly (" + std::to_string(body_read_) + " bytes in " +
                                std::to_string(seconds_since(body_start_)) + " s)");
            return -1;
        }
        const ssize_t n = ::recv(fd_, buf_.data(), buf_.size(), 0);
        if (n <= 0) return n;
        begin_ = 0;
        end_ = static_cast<size_t>(n);
        return 1;
    }

    // Up to `size` buffered bytes as they are; in the header block, checked and counted.
    ssize_t hand_out(char* ptr, size_t size) {
        size = std::min(size, end_ - begin_);
        if (in_headers_) {
            // The block ends at its blank line ("\n\r\n": httplib's reader takes CRLF lines only, a byte at a time).
            for (size_t i = 0; i < size; ++i) {
                const char c = buf_[begin_ + i];
                if (const char* bad = header_byte(c)) {
                    refuse(400, std::string("malformed HTTP request: ") + bad);
                    return -1;
                }
                if (c == '\n' && last_[0] == '\n' && last_[1] == '\r') {
                    size = i + 1;
                    in_headers_ = false;
                }
                last_[0] = last_[1];
                last_[1] = c;
                if (!in_headers_) break;
            }
            if (header_bytes_ + size > limits_.max_bytes) {
                refuse(431,
                       "the request line and headers are larger than " + std::to_string(limits_.max_bytes) + " bytes");
                return -1;
            }
            header_bytes_ += size;
        }
        std::memcpy(ptr, buf_.data() + begin_, size);
        begin_ += size;
        if (parsed_ && !in_headers_) body_read_ += static_cast<int64_t>(size);
        return static_cast<ssize_t>(size);
    }

    // What RFC 9112 has a server reject in a header block and httplib 0.11 took (null: the byte is fine): a line
    // folded onto the one before (obs-fold, §5.2: httplib dropped the continuation), a field line without a colon
    // (§5.1: dropped), a CR not before LF or a NUL (§2.2, §5.5: kept inside the value). A proxy in front may read
    // any of them otherwise. Empty lines before the request line are skipped, as §2.2 allows.
    const char* header_byte(char c) {
        if (prev_cr_ && c != '\n') return "a CR not followed by LF in the header block";
        prev_cr_ = c == '\r';
        if (c == '\0') return "a NUL byte in the header block";
        if (c == '\r') return nullptr;
        if (c == '\n') {
            if (line_len_ > 0 && line_index_ > 0 && !line_colon_) return "a header line without a colon";
            if (line_len_ > 0 || line_index_ > 0) ++line_index_;
            line_len_ = 0;
            line_colon_ = false;
            return nullptr;
        }
        if (line_len_ == 0 && line_index_ > 0 && (c == ' ' || c == '\t'))
            return "a header line folded onto the one before (obs-fold)";
        line_colon_ |= c == ':';
        ++line_len_;
        return nullptr;
    }

    // A chunked body's bytes as they are, less the trailer fields after its last chunk (the empty line that ends
    // them is handed out, so httplib sees the body end as it expects). A chunk size that is not hex digits is refused
    // here (httplib's strtoul would read some otherwise); the rest of the framing is httplib's to check.
    size_t hand_out_chunked(char* ptr, size_t size) {
        size_t out = 0;
        while (begin_ < end_ && out < size && chunk_ != ChunkState::kDone) {
            if (chunk_ == ChunkState::kData) {  // (the chunk's data, in one copy)
                const size_t n =
                    static_cast<size_t>(std::min<uint64_t>(chunk_left_, std::min<uint64_t>(end_ - begin_, size - out)));
                std::memcpy(ptr + out, buf_.data() + begin_, n);
                begin_ += n;
                out += n;
                body_read_ += static_cast<int64_t>(n);
                chunk_left_ -= n;
                if (chunk_left_ == 0) chunk_ = ChunkState::kDataEnd;
                continue;
            }
            const char c = buf_[begin_++];
            ++body_read_;
            bool keep = true;
            switch (chunk_) {
                case ChunkState::kSizeLine: {  // 1*HEXDIG, then an extension (";...") or the line's end
                    const int digit = c >= '0' && c <= '9'   ? c - '0'
                                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                             : -1;
                    if (chunk_digits_ >= 0 && digit >= 0) {
                        if (++chunk_digits_ > 15) return refuse_chunked("a chunk size of more than 15 hex digits");
                        chunk_left_ = chunk_left_ * 16 + static_cast<uint64_t>(digit);
                    } else if (chunk_digits_ == 0) {  // (httplib's strtoul would skip a sign, "0x", spaces)
                        return refuse_chunked("a chunk size line that does not begin with a hex digit");
                    } else if (chunk_digits_ > 0) {
                        if (c != ';' && c != ' ' && c != '\t' && c != '\r' && c != '\n')
                            return refuse_chunked("a chunk size followed by something other than an extension");
                        chunk_digits_ = -1;  // the size has ended
                    }
                    if (c == '\n') chunk_ = chunk_left_ > 0 ? ChunkState::kData : ChunkState::kTrailerLine;
                    break;
                }
                case ChunkState::kDataEnd:  // the CRLF after a chunk's data
                    if (c == '\n') {
                        chunk_ = ChunkState::kSizeLine;
                        chunk_left_ = 0;
                        chunk_digits_ = 0;
                    }
                    break;
                case ChunkState::kTrailerLine:  // the start of a line after the last chunk
                    if (c == '\r') {
                        chunk_ = ChunkState::kLastLf;
                    } else if (c == '\n') {
                        chunk_ = ChunkState::kDone;
                    } else {
                        keep = false;
                        chunk_ = ChunkState::kTrailerField;
                    }
                    break;
                case ChunkState::kTrailerField:  // dropped, to its LF
                    keep = false;
                    if (c == '\n') chunk_ = ChunkState::kTrailerLine;
                    break;
                case ChunkState::kLastLf: chunk_ = ChunkState::kDone; break;
                case ChunkState::kData:
                case ChunkState::kDone: break;
            }
            if (!keep && ++trailer_bytes_ > limits_.max_bytes) {
                refuse(431,
                       "the request's trailer fields are larger than " + std::to_string(limits_.max_bytes) + " bytes");
                return 0;
            }
            if (keep) ptr[out++] = c;
        }
        // (Past the body's end: the rest as it is.)
        if (out == 0 && chunk_ == ChunkState::kDone && begin_ < end_) return static_cast<size_t>(hand_out(ptr, size));
        return out;
    }

public:
    ssize_t write(const char* ptr, size_t size) override {
        if (failed_ || !is_writable()) return -1;
        return ::send(fd_, ptr, size, MSG_NOSIGNAL);
    }

    void get_remote_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
    void get_local_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
    int socket() const override { return fd_; }

private:
    static int64_t seconds_since(std::chrono::steady_clock::time_point t) {
        return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t).count();
    }
    // The body's pace: the header timeout's grace, then at least kMinBodyRate bytes a second on average (nginx bounds
    // only the gap between reads, which a trickle of a byte at a time never exceeds).
    static constexpr int64_t kMinBodyRate = 16 << 10;
    std::chrono::microseconds body_time_left() const {
        const auto allowed = std::chrono::duration_cast<std::chrono::microseconds>(limits_.timeout) +
                             std::chrono::microseconds(body_read_ * 1000000 / kMinBodyRate);
        return allowed -
               std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - body_start_);
    }
    size_t refuse_chunked(const std::string& what) {
        refuse(400, "malformed chunked request body: " + what);
        return 0;
    }
    std::chrono::microseconds header_time_left() const {
        return std::chrono::duration_cast<std::chrono::microseconds>(header_deadline_ -
                                                                     std::chrono::steady_clock::now());
    }
    bool wait(short events, std::chrono::microseconds timeout) const {
        if (timeout < std::chrono::microseconds::zero()) timeout = std::chrono::microseconds::zero();
        pollfd p{fd_, events, 0};
        const int ms = static_cast<int>(std::min<int64_t>((timeout.count() + 999) / 1000, INT32_MAX));
        int r;
        do {
            r = ::poll(&p, 1, ms);
        } while (r < 0 && errno == EINTR);
        return r > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
    }
    // The answer httplib cannot give (its reader would only say 400): written here, the connection then ends
    // (httplib's own answer to the failed read is not sent: writes fail from now on).
    void refuse(int status, const std::string& message) {
        const std::string body = error_body(api_error(status, message));
        const char* reason = status == 431   ? " Request Header Fields Too Large"
                             : status == 408 ? " Request Timeout"
                                             : " Bad Request";
        const std::string head =
            "HTTP/1.1 " + std::to_string(status) + reason +
            "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\nConnection: close\r\n" +
            (limits_.cors_origin.empty() ? ""
                                         : "Access-Control-Allow-Origin: " + limits_.cors_origin +
                                               (limits_.cors_origin == "*" ? "\r\n" : "\r\nVary: Origin\r\n")) +
            "\r\n";
        const std::string all = head + body;
        if (wait(POLLOUT, write_timeout_)) (void)::send(fd_, all.data(), all.size(), MSG_NOSIGNAL);
        failed_ = true;
        std::fprintf(stderr, "[http] %d: %s\n", status, message.c_str());
    }
    void address(bool peer, std::string& ip, int& port) const {
        sockaddr_storage a{};
        socklen_t len = sizeof(a);
        if ((peer ? ::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len)
                  : ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len)) != 0)
            return;
        char text[INET6_ADDRSTRLEN] = {};
        if (a.ss_family == AF_INET) {
            const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
            ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
            port = ntohs(v4->sin_port);
        } else if (a.ss_family == AF_INET6) {
            const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
            ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
            port = ntohs(v6->sin6_port);
        } else {
            return;
        }
        ip = text;
    }

    const int fd_;
    const std::chrono::microseconds read_timeout_, write_timeout_;
    const HeaderLimits limits_;
    std::array<char, 16384> buf_{};
    size_t begin_ = 0, end_ = 0;  // buf_[begin_, end_) read from the socket, not yet handed out
    bool in_headers_ = false, failed_ = false;
    bool parsed_ = false, close_ = false, chunked_ = false;  // this request's (begin_request resets them)
    int64_t declared_length_ = 0, body_read_ = 0;
    std::chrono::steady_clock::time_point body_start_{};
    char last_[2] = {0, 0};  // the header block's last two bytes handed out
    size_t header_bytes_ = 0;
    // The header block's current line (header_byte): its length less CR / LF, its index (0: the request line),
    // whether it has had a colon, whether the last byte was a CR.
    size_t line_len_ = 0, line_index_ = 0;
    bool line_colon_ = false, prev_cr_ = false;
    // A chunked body's framing (hand_out_chunked): where in it the next byte is, the current chunk's bytes left, its
    // size line's hex digits so far (-1: the size has ended), the trailer bytes dropped.
    enum class ChunkState { kSizeLine, kData, kDataEnd, kTrailerLine, kTrailerField, kLastLf, kDone };
    ChunkState chunk_ = ChunkState::kSizeLine;
    uint64_t chunk_left_ = 0;
    int chunk_digits_ = 0;
    size_t trailer_bytes_ = 0;
    std::chrono::steady_clock::time_point header_deadline_{};
};

// The connection the calling worker thread serves (set by GuardedServer's loop), for close_after and the error
// handler; null outside a connection.
thread_local ConnectionStream* t_stream = nullptr;

// httplib's server with its connection loop replaced (ConnectionStream: the header block's limits, pipelined
// requests). process_and_close_socket is the library's virtual for this; process_request parses and answers one
// request from a stream.
class GuardedServer final : public httplib::Server {
public:
    void set_header_limits(HeaderLimits limits) { header_limits_ = limits; }

private:
    bool process_and_close_socket(socket_t sock) override {
        ConnectionStream strm(
            sock, std::chrono::seconds(read_timeout_sec_) + std::chrono::microseconds(read_timeout_usec_),
            std::chrono::seconds(write_timeout_sec_) + std::chrono::microseconds(write_timeout_usec_), header_limits_);
        bool ret = false;
        t_stream = &strm;
        for (size_t left = keep_alive_max_count_; left > 0 && !strm.failed(); --left) {
            if (!strm.has_buffered() && !wait_for_request(sock)) break;
            const bool close_connection = left == 1 || svr_sock_ == INVALID_SOCKET;
            bool connection_closed = false;
            strm.begin_request();
            ret = process_request(strm, close_connection, connection_closed, [&strm](httplib::Request& req) {
                strm.headers_done(req);
                // HTTP/1.0 has no 100 Continue (RFC 9110 §10.1.1: the expectation is ignored).
                if (req.version == "HTTP/1.0") req.headers.erase("Expect");
            });
            // httplib decides to close from the request's own `Connection` before it is answered: an answer that
            // said `Connection: close` (close_after), a request it could not parse, or a body left unread (a GET's,
            // an error answered before the body) kept the connection, and the unread bytes ran as the next request.
            if (!ret || connection_closed || strm.closing() || strm.body_left()) break;
        }
        t_stream = nullptr;
        linger_close(sock);
        return ret;
    }
    // A lingering close (as nginx's): the answer's end is sent (FIN), then what the client still sends is read and
    // dropped for a moment before the socket is closed. Closed with unread bytes (a 413's body, a 431's headers),
    // the socket would send a reset that can destroy the answer at the client before it is read (EPIPE there).
    // At most 500 ms and 4 MB.
    static void linger_close(socket_t sock) {
        ::shutdown(sock, SHUT_WR);
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
        char sink[16384];
        size_t drained = 0;
        while (drained < (size_t{4} << 20)) {  // (a client sending on and on is cut off: reset)
            const auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
            if (left.count() <= 0) break;
            pollfd p{sock, POLLIN, 0};
            const int r = ::poll(&p, 1, static_cast<int>(left.count()));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            const ssize_t n = ::recv(sock, sink, sizeof(sink), 0);
            if (n <= 0) break;  // the client closed its end (or reset)
            drained += static_cast<size_t>(n);
        }
        ::close(sock);
    }
    // The next request's first bytes, while the server runs, up to the keep-alive timeout.
    bool wait_for_request(socket_t sock) const {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
        while (svr_sock_ != INVALID_SOCKET) {
            pollfd p{sock, POLLIN, 0};
            const int r = ::poll(&p, 1, 100);
            if (r > 0) return true;
            if (r < 0 && errno != EINTR) return false;
            if (std::chrono::steady_clock::now() >= until) return false;
        }
        return false;
    }

    HeaderLimits header_limits_;
};

// httplib's ThreadPool, except that a thread the system will not start (its thread or memory limit) leaves the pool
// smaller: httplib's constructor throws with its first threads already waiting, and the half-built pool then ends
// the process (a joinable std::thread destroyed) or hangs its shutdown. At the limit a quarter of the threads
// started are let go again, so that the rest of the server can still start its own. With no thread at all,
// connections are served one at a time on the accepting thread.
class ConnectionPool final : public httplib::TaskQueue {
public:
    explicit ConnectionPool(size_t n) : keep_(n) {
        threads_.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            try {
                threads_.emplace_back([this, i] { work(i); });
            } catch (const std::exception& e) {
                {
                    std::lock_guard<std::mutex> lock(mu_);
                    keep_ = i - i / 4;
                }
                cv_.notify_all();
                for (size_t j = keep_; j < threads_.size(); ++j) threads_[j].join();
                threads_.resize(keep_);
                std::fprintf(stderr, "[serve] %zu of %zu HTTP threads: the system would not start more (%s)\n", keep_,
                             n, e.what());
                break;
            }
        }
    }
    ~ConnectionPool() override { shutdown(); }

    void enqueue(std::function<void()> fn) override {
        if (threads_.empty()) {
            fn();
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            jobs_.push_back(std::move(fn));
        }
        cv_.notify_one();
    }

    void shutdown() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stopping_ = true;
        }
        cv_.notify_all();
        for (std::thread& t : threads_)
            if (t.joinable()) t.join();
    }

private:
    void work(size_t index) {
        for (;;) {
            std::function<void()> fn;
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [&] { return stopping_ || !jobs_.empty() || index >= keep_; });
                if (index >= keep_) return;  // let go at the system's limit (no connection yet: none was accepted)
                if (jobs_.empty()) return;   // stopping, and every accepted connection served
                fn = std::move(jobs_.front());
                jobs_.pop_front();
            }
            fn();
        }
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    size_t keep_;  // threads with a smaller index serve
    bool stopping_ = false;
};

constexpr std::chrono::milliseconds kStreamPoll{100};

// Ends the connection after this response. httplib 0.11 writes the answer's `Connection` header from the request's
// (a response header set here was sent beside its own, twice, or beside `Keep-Alive`), so it is set there; and the
// connection loop ends the connection (httplib had decided to keep it before the request was answered). The request
// object is httplib's own non-const one; handlers are only given it as const.
void close_after(const httplib::Request& req) {
    if (t_stream != nullptr) t_stream->close_after_response();
    auto& mreq = const_cast<httplib::Request&>(req);
    if (mreq.get_header_value("Connection") != "close") {
        mreq.headers.erase("Connection");
        mreq.headers.emplace("Connection", "close");
    }
}

// The server-side socket of a connection, found by its peer address among this process's open
// descriptors (httplib 0.11 hands a handler no socket, and has no is_connection_closed); -1 when none
// matches. While the handler runs, httplib keeps that connection (and so the descriptor) open.
int find_connection_fd(const std::string& peer_addr, int peer_port, int local_port) {
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int found = -1;
    while (const dirent* ent = ::readdir(dir)) {
        char* end = nullptr;
        const long fd = std::strtol(ent->d_name, &end, 10);
        if (end == ent->d_name || *end != '\0' || fd < 0) continue;
        struct stat st;
        if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        sockaddr_storage peer{}, local{};
        socklen_t pl = sizeof(peer), ll = sizeof(local);
        if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
            ::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0)
            continue;
        char host[INET6_ADDRSTRLEN] = {};
        int pport = -1, lport = -1;
        if (peer.ss_family == AF_INET && local.ss_family == AF_INET) {
            const auto* p4 = reinterpret_cast<const sockaddr_in*>(&peer);
            ::inet_ntop(AF_INET, &p4->sin_addr, host, sizeof(host));
            pport = ntohs(p4->sin_port);
            lport = ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
        } else if (peer.ss_family == AF_INET6 && local.ss_family == AF_INET6) {
            const auto* p6 = reinterpret_cast<const sockaddr_in6*>(&peer);
            ::inet_ntop(AF_INET6, &p6->sin6_addr, host, sizeof(host));
            pport = ntohs(p6->sin6_port);
            lport = ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
        } else {
            continue;
        }
        if (pport == peer_port && lport == local_port && peer_addr == host) {
            found = static_cast<int>(fd);
            break;
        }
    }
    ::closedir(dir);
    return found;
}

// A POST body's framing that cannot be read, judged from its headers alone (see the POST handler).
std::optional<ApiError> framing_error(const std::string& te_lower, bool has_length, const std::string& length,
                                      size_t limit) {
    if (!te_lower.empty()) {
        if (te_lower == "chunked") return std::nullopt;
        return api_error(501, "Transfer-Encoding '" + te_lower + "' is not supported (only chunked)");
    }
    if (!has_length) {
        return api_error(411, "a request body needs a Content-Length header or chunked Transfer-Encoding",
                         "length_required");
    }
    uint64_t n = 0;
    const char* b = length.data();
    const char* e = b + length.size();
    const auto [ptr, ec] = std::from_chars(b, e, n);
    if (length.empty() || ec == std::errc::result_out_of_range) {
        if (ec == std::errc::result_out_of_range && ptr == e)
            return api_error(413, "the request body is larger than the limit of " + std::to_string(limit) + " bytes",
                             "request_too_large");
        return api_error(400, "Content-Length '" + length + "' is not a byte count");
    }
    if (ec != std::errc() || ptr != e) return api_error(400, "Content-Length '" + length + "' is not a byte count");
    if (n > limit) {
        return api_error(413, "the request body is larger than the limit of " + std::to_string(limit) + " bytes",
                         "request_too_large");
    }
    return std::nullopt;
}

// Whether the peer has closed (or reset) the connection: an end of stream or an error where a
// non-blocking peek would otherwise find nothing, or the next request's bytes.
bool peer_closed(int fd) {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0) return false;
    if (n == 0) return true;
    return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

// Endpoint label for the request counter: known routes by name, everything else "other" (a label
// per unknown path would let clients grow the metrics without bound).
std::string endpoint_label(const std::string& path) {
    static const char* const kKnown[] = {
        "/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize",
        "/detokenize",          "/version"};
    for (const char* k : kKnown) {
        if (path == k) return k;
    }
    if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
    return "other";
}

// Equal in time independent of where the strings differ (only their lengths show).
bool same_secret(std::string_view a, std::string_view b) {
    unsigned diff = a.size() == b.size() ? 0u : 1u;
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff |= static_cast<unsigned>(x ^ y);
    }
    return diff == 0;
}

// Paths open without an API key: liveness probes and the Prometheus scrape (as vLLM leaves them).
bool public_path(const httplib::Request& req) {
    if (req.method == "OPTIONS") return true;  // CORS preflights carry no credentials (Fetch standard)
    if (req.method != "GET" && req.method != "HEAD") return false;
    return req.path == "/health" || req.path == "/metrics" || req.path == "/version";
}

void set_error(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    if (e.http_status == 503) res.set_header("Retry-After", "1");  // warming up, at capacity, stopping
    res.set_content(error_body(e), "application/json");
}

// With API keys configured, a request to a non-public path without an accepted key gets the 401 (true).
bool refuse_without_key(const std::vector<std::string>& keys, const httplib::Request& req, httplib::Response& res) {
    if (keys.empty() || public_path(req) ||
        api_key_accepted(keys, req.get_header_value("Authorization"), req.get_header_value("X-Api-Key")))
        return false;
    close_after(req);  // the body is not read
    res.set_header("WWW-Authenticate", "Bearer");
    const bool sent = req.has_header("Authorization") || req.has_header("X-Api-Key");
    set_error(res, api_error(401,
                             sent ? "Incorrect API key provided"
                                  : "Missing API key: send it as the header 'Authorization: Bearer <key>'",
                             "invalid_api_key"));
    return true;
}

// A compressed request body (Content-Encoding other than identity): 415, the body unread (httplib would inflate it
// before any size limit applies to the inflated bytes: a 510 KB gzip body grew the server to 13.7 GB).
// The routes' paths: POST ones that read a JSON body, and GET / HEAD ones (their other methods are 405s with Allow).
constexpr const char* kPostPaths[] = {"/v1/chat/completions", "/v1/responses", "/v1/responses/input_tokens",
                                      "/v1/completions",      "/tokenize",     "/detokenize",
                                      "/v1/kv/prefill"};
constexpr const char* kGetPaths[] = {"/v1/models", "/v1/models/(.+)", "/health", "/metrics", "/version"};

// For `Expect: 100-continue`: nullopt where a handler reads the body (a POST route above) or routing decides (a stored
// response's paths); else the final answer's Allow list, or nullptr for an unknown path (404).
// GET, HEAD and OPTIONS are left to routing (a preflight's 204, their 405s).
std::optional<const char*> expect_route_error(const httplib::Request& req) {
    const std::string& path = req.path;
    if (req.method != "POST" && req.method != "PUT" && req.method != "PATCH" && req.method != "DELETE")
        return std::nullopt;
    if (std::find(std::begin(kPostPaths), std::end(kPostPaths), path) != std::end(kPostPaths))
        return req.method == "POST" ? std::nullopt : std::optional<const char*>("POST");
    if (path.rfind("/v1/responses/", 0) == 0 && path.size() > 14) return std::nullopt;
    // kGetPaths as routing matches them (httplib: the whole path against the pattern).
    for (const char* pattern : kGetPaths)
        if (std::regex_match(path, std::regex(pattern))) return std::optional<const char*>("GET, HEAD");
    return std::optional<const char*>(nullptr);
}

// Whether the request says it has a body (chunked, or a Content-Length other than 0).
bool has_body(const httplib::Request& req) {
    return req.has_header("Transfer-Encoding") ||
           (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

// A body this server cannot take as it comes (415, before it is read; the connection then ends): compressed, or
// multipart.
bool refuse_encoding(const httplib::Request& req, httplib::Response& res) {
    std::string enc = req.get_header_value("Content-Encoding");
    std::transform(enc.begin(), enc.end(), enc.begin(), [](unsigned char ch) { return std::tolower(ch); });
    if (!enc.empty() && enc != "identity") {
        close_after(req);
        set_error(res, api_error(415,
                                 "Content-Encoding '" + req.get_header_value("Content-Encoding") +
                                     "' is not supported: send the request body uncompressed",
                                 "unsupported_content_encoding"));
        return true;
    }
    // A multipart body (httplib 0.11 parses one itself, for handlers that take its parts, and failed the plain
    // read this server does as "malformed"): every body here is one JSON document.
    if (req.is_multipart_form_data() && has_body(req)) {
        close_after(req);
        set_error(res, api_error(415,
                                 "a multipart/form-data body is not accepted: send the request as a JSON document "
                                 "(Content-Type: application/json)",
                                 "unsupported_content_type"));
        return true;
    }
    return false;
}

// Writes a RouteResponse into httplib's response; SSE bodies are pulled from the producer by the
// connection's worker thread as httplib writes the body: chunked for HTTP/1.1, and for an HTTP/1.0
// client (which cannot decode chunked encoding, RFC 9112 §6.1) unframed, the end of the body being
// the end of the connection.
// client_gone (may be empty): asked while a stream has nothing to write (at most every kStreamPoll), so that a
// client gone during a long prompt is noticed then, not at the next keep-alive comment's failed write.
void send(const httplib::Request& req, httplib::Response& res, RouteResponse r,
          std::function<bool()> client_gone = {}) {
    res.status = r.status;
    if (r.status == 503) res.set_header("Retry-After", "1");
    if (!r.pieces.empty()) {
        // The head, then each piece, written from where the last write ended (httplib passes that offset).
        auto parts = std::make_shared<std::vector<std::string_view>>();
        auto head = std::make_shared<std::string>(std::move(r.body));
        parts->push_back(*head);
        size_t total = head->size();
        for (std::string_view p : r.pieces) {
            parts->push_back(p);
            total += p.size();
        }
        res.set_content_provider(total, r.content_type,
                                 [parts, head, owner = r.pieces_owner](size_t offset, size_t, httplib::DataSink& sink) {
                                     for (std::string_view p : *parts) {
                                         if (offset >= p.size()) {
                                             offset -= p.size();
                                             continue;
                                         }
                                         constexpr size_t kChunk = size_t{4} << 20;
                                         return sink.write(p.data() + offset, std::min(kChunk, p.size() - offset));
                                     }
                                     return false;  // past the end: httplib stops at `total` first
                                 });
        return;
    }
    if (!r.stream) {
        res.set_content(r.body, r.content_type);
        return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    std::shared_ptr<SseProducer> producer(std::move(r.stream));
    auto provide = [producer, client_gone = std::move(client_gone)](size_t, httplib::DataSink& sink) {
        // httplib does not guard content providers: nothing may escape from here (an exception
        // would end the worker thread, and with it the process).
        try {
            std::string buf;
            auto last_check = std::chrono::steady_clock::now();
            for (;;) {
                buf.clear();
                const bool more = producer->next(&buf, kStreamPoll);
                // A failed write means the client is gone: returning false ends the exchange, and
                // dropping the producer (with the response) cancels the request and frees its blocks.
                if (!buf.empty() && !sink.write(buf.data(), buf.size())) return false;
                if (buf.empty() && more && client_gone &&
                    std::chrono::steady_clock::now() - last_check >= kStreamPoll) {
                    last_check = std::chrono::steady_clock::now();
                    if (client_gone()) return false;
                }
                if (!more) {
                    sink.done();
                    return true;
                }
            }
        } catch (const std::exception& e) {
            LOG_ERROR("stream aborted: %s", e.what());
        } catch (...) {
            LOG_ERROR("stream aborted by an unknown exception");
        }
        return false;
    };
    if (req.version == "HTTP/1.0") {
        close_after(req);
        res.set_content_provider(r.content_type, provide);
    } else {
        res.set_chunked_content_provider(r.content_type, provide);
    }
}

}  // namespace

std::string log_safe(std::string_view v) {
    std::string out;
    for (unsigned char ch : v.substr(0, 512)) {
        if (ch < 0x20 || ch > 0x7e || ch == '"' || ch == '\\') {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", ch);
            out += buf;
        } else {
            out += static_cast<char>(ch);
        }
    }
    return out;
}

bool api_key_accepted(const std::vector<std::string>& keys, std::string_view authorization,
                      std::string_view x_api_key) {
    auto trim = [](std::string_view v) {
        while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
        while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
        return v;
    };
    std::string_view bearer;
    authorization = trim(authorization);
    constexpr std::string_view kScheme = "bearer";
    if (authorization.size() > kScheme.size() &&
        std::equal(kScheme.begin(), kScheme.end(), authorization.begin(),
                   [](char a, char b) { return std::tolower(static_cast<unsigned char>(b)) == a; }) &&
        (authorization[kScheme.size()] == ' ' || authorization[kScheme.size()] == '\t')) {
        bearer = trim(authorization.substr(kScheme.size()));
    }
    x_api_key = trim(x_api_key);
    bool ok = false;  // every key is compared, so the time does not tell which one matched
    for (const std::string& k : keys) {
        if (k.empty()) continue;
        ok |= !bearer.empty() && same_secret(bearer, k);
        ok |= !x_api_key.empty() && same_secret(x_api_key, k);
    }
    return ok;
}

struct HttpServer::Impl {
    GuardedServer svr;
    int listen_fd = -1;
    // Started by bind(), before the caller loads its model: a pool that grows to the system's thread or memory limit
    // while the model loads on another thread took the loader's memory (std::bad_alloc ended the process under a
    // 12 GB address-space limit and 8192 threads). listen() hands it to httplib, which owns it from then on.
    std::unique_ptr<ConnectionPool> pool;
};

HttpServer::HttpServer(OpenAiRoutes& routes, ServerMetrics& metrics, HttpServerOptions options)
    : impl_(std::make_unique<Impl>()) {
    GuardedServer& svr = impl_->svr;
    const int threads = std::max(options.threads, 4);
    svr.new_task_queue = [impl = impl_.get(), threads]() -> httplib::TaskQueue* {
        if (impl->pool) return impl->pool.release();
        return new ConnectionPool(static_cast<size_t>(threads));
    };
    svr.set_payload_max_length(options.max_body_bytes);
    svr.set_read_timeout(options.read_timeout);
    svr.set_write_timeout(options.write_timeout);
    svr.set_keep_alive_timeout(options.keep_alive_timeout_s);
    svr.set_keep_alive_max_count(1000);
    svr.set_header_limits(HeaderLimits{options.max_header_bytes, options.header_timeout, options.cors_origin});
    svr.set_tcp_nodelay(true);
    // SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, which would let a second server
    // silently share the port); remember the socket to widen its listen backlog after bind.
    svr.set_socket_options([impl = impl_.get()](socket_t sock) {
        int yes = 1;
        ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        impl->listen_fd = sock;
    });

    // The body is read here, not by httplib: its 0.11 reader enforces set_payload_max_length only on a
    // Content-Length body, so a chunked body of any size was buffered whole (a probe sent 400 MB:
    // 200 after 38 s, 3 GB resident). Reading stops at the limit, the answer is 413 and the
    // connection is closed (the rest of the body is never read).
    const size_t body_limit = options.max_body_bytes;
    using Handler = std::function<RouteResponse(std::string_view, const OpenAiRoutes::ClientGone&)>;
    auto post = [this, &svr, body_limit](const char* path, Handler handler) {
        svr.Post(path, [this, handler, body_limit](const httplib::Request& req, httplib::Response& res,
                                                   const httplib::ContentReader& reader) {
            // Framing that httplib would only end at the read timeout (it waits for a body that
            // never comes), answered at once without reading: no length at all (411), a
            // Transfer-Encoding other than chunked (501), a Content-Length that is not a
            // non-negative integer (400) or over the limit (413).
            std::string te = req.get_header_value("Transfer-Encoding");
            std::transform(te.begin(), te.end(), te.begin(), [](unsigned char ch) { return std::tolower(ch); });
            // Content-Length headers that disagree (RFC 9112 §6.3: an unrecoverable framing error;
            // a proxy and this server could read different bodies).
            bool conflicting = false;
            for (size_t i = 1; i < req.get_header_value_count("Content-Length"); ++i)
                conflicting |= req.get_header_value("Content-Length", i) != req.get_header_value("Content-Length", 0);
            if (conflicting) {
                close_after(req);
                set_error(res, api_error(400, "the request has Content-Length headers that disagree"));
                return;
            }
            if (auto early = framing_error(te, req.has_header("Content-Length"), req.get_header_value("Content-Length"),
                                           body_limit)) {
                close_after(req);
                set_error(res, *early);
                return;
            }
            std::string body;
            bool too_large = false;
            const bool read = reader([&](const char* data, size_t n) {
                if (n > body_limit - body.size()) {
                    too_large = true;
                    return false;
                }
                body.append(data, n);
                return true;
            });
            if (too_large || (!read && res.status == 413)) {
                close_after(req);
                set_error(res, api_error(413,
                                         "the request body is larger than the limit of " + std::to_string(body_limit) +
                                             " bytes",
                                         "request_too_large"));
                return;
            }
            if (!read) {
                close_after(req);
                set_error(res, api_error(400,
                                         "the request body could not be read (a short body or a malformed "
                                         "chunked encoding)"));
                return;
            }
            // The connection's socket is looked up on the first question (a streaming request never pays for
            // the scan; a non-streaming one asks before its request reaches the engine, OpenAiRoutes::generate);
            // not found: never gone.
            // (Shared with a stream's body, which is written after this handler returns.)
            auto fd = std::make_shared<int>(-2);
            const OpenAiRoutes::ClientGone client_gone = [fd, addr = req.remote_addr, peer = req.remote_port,
                                                          local = port_] {
                if (*fd == -2) *fd = find_connection_fd(addr, peer, local);
                return *fd >= 0 && peer_closed(*fd);
            };
            send(req, res, handler(body, client_gone), client_gone);
        });
    };
    post("/v1/chat/completions",
         [&routes](std::string_view b, const OpenAiRoutes::ClientGone& g) { return routes.chat_completions(b, g); });
    post("/v1/responses",
         [&routes](std::string_view b, const OpenAiRoutes::ClientGone& g) { return routes.responses(b, g); });
    // (before the stored responses' POST /v1/responses/{id}/cancel below)
    post("/v1/responses/input_tokens",
         [&routes](std::string_view b, const OpenAiRoutes::ClientGone&) { return routes.responses_input_tokens(b); });
    post("/v1/completions",
         [&routes](std::string_view b, const OpenAiRoutes::ClientGone& g) { return routes.completions(b, g); });
    post("/tokenize", [&routes](std::string_view b, const OpenAiRoutes::ClientGone&) { return routes.tokenize(b); });
    post("/v1/kv/prefill",
         [&routes](std::string_view b, const OpenAiRoutes::ClientGone& g) { return routes.kv_prefill(b, g); });
    post("/detokenize",
         [&routes](std::string_view b, const OpenAiRoutes::ClientGone&) { return routes.detokenize(b); });
    svr.Get("/v1/models",
            [&routes](const httplib::Request& req, httplib::Response& res) { send(req, res, routes.models()); });
    svr.Get("/v1/models/(.+)", [&routes](const httplib::Request& req, httplib::Response& res) {
        send(req, res, routes.model(req.matches[1].str()));
    });
    svr.Get("/health",
            [&routes](const httplib::Request& req, httplib::Response& res) { send(req, res, routes.health()); });
    svr.Get("/metrics",
            [&routes](const httplib::Request& req, httplib::Response& res) { send(req, res, routes.metrics()); });
    svr.Get("/version", [](const httplib::Request&, httplib::Response& res) {  // vLLM's route
        res.set_content(std::string(R"({"version":")") + kVersion + "\"}", "application/json");
    });

    // Known paths with the wrong method: 405 with Allow. Methods that may carry a body take
    // httplib's content-reader form, so the body is never waited for (a PUT without a length held
    // a worker for the read timeout, then got 400); their connection is closed, its body unread.
    auto not_allowed_error = [](const httplib::Request& req, httplib::Response& res, const char* allow) {
        res.set_header("Allow", allow);
        set_error(res, api_error(405, "method " + req.method + " is not allowed on " + req.path +
                                          " (allowed: " + allow + ")"));
    };
    auto not_allowed = [not_allowed_error](const char* allow) {
        return [allow, not_allowed_error](const httplib::Request& req, httplib::Response& res) {
            not_allowed_error(req, res, allow);
        };
    };
    auto not_allowed_with_body = [not_allowed_error](const char* allow) {
        return httplib::Server::HandlerWithContentReader([allow, not_allowed_error](const httplib::Request& req,
                                                                                    httplib::Response& res,
                                                                                    const httplib::ContentReader&) {
            close_after(req);
            not_allowed_error(req, res, allow);
        });
    };
    // CORS preflight (options.cors_origin): 204 with what the path allows; the origin header itself
    // goes on every routed answer (the post-routing handler below).
    const bool cors = !options.cors_origin.empty();
    auto preflight = [](const char* methods) {
        return [methods](const httplib::Request& req, httplib::Response& res) {
            res.status = 204;
            res.set_header("Access-Control-Allow-Methods", methods);
            const std::string asked = req.get_header_value("Access-Control-Request-Headers");
            res.set_header("Access-Control-Allow-Headers", asked.empty() ? "authorization, content-type" : asked);
            res.set_header("Access-Control-Max-Age", "600");
        };
    };
    for (const char* path : kPostPaths) {
        auto h = not_allowed("POST");
        auto hb = not_allowed_with_body("POST");
        svr.Get(path, h);
        svr.Put(path, hb);
        svr.Patch(path, hb);
        svr.Delete(path, hb);
        if (cors) {
            svr.Options(path, preflight("POST, OPTIONS"));
        } else {
            svr.Options(path, h);
        }
    }
    for (const char* path : kGetPaths) {
        auto h = not_allowed("GET, HEAD");
        auto hb = not_allowed_with_body("GET, HEAD");
        svr.Post(path, hb);
        svr.Put(path, hb);
        svr.Patch(path, hb);
        svr.Delete(path, hb);
        if (cors) {
            svr.Options(path, preflight("GET, HEAD, OPTIONS"));
        } else {
            svr.Options(path, h);
        }
    }
    // The Responses API's stored responses (OpenAiRoutes::retrieve_response and the rest): retrieve (and
    // input_items), delete, cancel.
    svr.Get("/v1/responses/(.+)", [&routes](const httplib::Request& req, httplib::Response& res) {
        send(req, res, routes.retrieve_response(req.matches[1].str(), req.params));
    });
    svr.Delete("/v1/responses/(.+)",
               httplib::Server::HandlerWithContentReader(
                   [&routes](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
                       close_after(req);
                       send(req, res, routes.delete_response(req.matches[1].str()));
                   }));
    svr.Post("/v1/responses/(.+)",
             httplib::Server::HandlerWithContentReader(
                 [&routes](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
                     close_after(req);
                     send(req, res, routes.cancel_response(req.matches[1].str()));
                 }));
    {  // A stored response's other methods, and its CORS preflight (a browser's DELETE or cancel asks first), with
       // what each of its paths allows: {id} GET and DELETE, {id}/cancel POST, {id}/input_items GET.
        const auto allowed = [](const httplib::Request& req, bool options) -> const char* {
            const std::string rest = req.matches[1].str();
            const auto ends = [&](std::string_view tail) {
                return rest.size() > tail.size() && rest.compare(rest.size() - tail.size(), tail.size(), tail) == 0;
            };
            if (ends("/cancel")) return options ? "POST, OPTIONS" : "POST";
            if (ends("/input_items")) return options ? "GET, OPTIONS" : "GET";
            return options ? "GET, DELETE, OPTIONS" : "GET, DELETE";
        };
        const auto other = httplib::Server::HandlerWithContentReader(
            [allowed, not_allowed_error](const httplib::Request& req, httplib::Response& res,
                                         const httplib::ContentReader&) {
                close_after(req);
                not_allowed_error(req, res, allowed(req, false));
            });
        svr.Put("/v1/responses/(.+)", other);
        svr.Patch("/v1/responses/(.+)", other);
        svr.Options("/v1/responses/(.+)",
                    [allowed, preflight, not_allowed_error, cors](const httplib::Request& req, httplib::Response& res) {
                        if (cors) {
                            preflight(allowed(req, true))(req, res);
                        } else {
                            not_allowed_error(req, res, allowed(req, false));
                        }
                    });
    }
    // Any other path with a method that may carry a body: 404 at once, the body unread and the
    // connection closed (httplib would first wait for a body that may never come: a bodiless POST to
    // /v1/embeddings held a worker for the read timeout, then got 400). Registered after every known
    // route: httplib tries its content-reader handlers in order.
    auto not_found_with_body = httplib::Server::HandlerWithContentReader(
        [](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
            close_after(req);
            set_error(res, api_error(404, "unknown route " + req.method + " " + req.path));
        });
    svr.Post(".*", not_found_with_body);
    svr.Put(".*", not_found_with_body);
    svr.Patch(".*", not_found_with_body);
    // Every answer: the CORS origin (when on), and the request's X-Request-Id echoed (vLLM's request-id headers, for
    // tracing through proxies), when it is 1 to 256 visible ASCII characters.
    svr.set_post_routing_handler(
        [cors, origin = options.cors_origin](const httplib::Request& req, httplib::Response& res) {
            if (cors) {
                res.set_header("Access-Control-Allow-Origin", origin);
                if (origin != "*") res.set_header("Vary", "Origin");
            }
            const std::string id = req.get_header_value("X-Request-Id");
            if (!id.empty() && id.size() <= 256 &&
                std::all_of(id.begin(), id.end(), [](char ch) { return ch > ' ' && ch < 0x7f; }))
                res.set_header("X-Request-Id", id);
        });

    // `Expect: 100-continue`: the client waits for the 100 before sending its body, so a request without a valid
    // API key is answered 401 here, before the body (the 100 went out first, and the client uploaded for nothing).
    // A compressed body (415) or one over --max-body-bytes (413) is refused the same way, instead of the 100; the
    // connection then ends.
    svr.set_expect_100_continue_handler([keys = options.api_keys, max_body = options.max_body_bytes](
                                            const httplib::Request& req, httplib::Response& res) {
        if (refuse_without_key(keys, req, res)) return res.status;
        // A request no handler would read a body for is answered now with its final status, not a 100 first
        // (RFC 9110 §10.1.1): an unknown path 404, a known one with another method 405. The connection then ends.
        if (const auto allow = expect_route_error(req)) {
            close_after(req);
            if (*allow == nullptr) {
                set_error(res, api_error(404, "unknown route " + req.method + " " + req.path));
            } else {
                res.set_header("Allow", *allow);
                set_error(res, api_error(405, "method " + req.method + " is not allowed on " + req.path +
                                                  " (allowed: " + *allow + ")"));
            }
            return res.status;
        }
        if (refuse_encoding(req, res)) return res.status;
        // (The POST handler's own framing check, its 413 only: a length it cannot read is that handler's to answer.)
        const auto early = framing_error("", true, req.get_header_value("Content-Length"), max_body);
        if (req.has_header("Content-Length") && early && early->http_status == 413) {
            close_after(req);
            set_error(res, *early);
            return 413;
        }
        return 100;
    });

    // Request bodies come uncompressed (as vLLM's server takes them). httplib inflates a gzip or
    // deflate body while reading it, before any size limit applies to the inflated bytes: a 510 KB
    // gzip body grew the server to 13.7 GB (session 15's probe). This runs before the body is
    // read; the unread body ends the connection.
    svr.set_pre_routing_handler([keys = options.api_keys](const httplib::Request& req, httplib::Response& res) {
        // Range requests do not apply to API answers (RFC 9110 §14.2: a server may ignore Range):
        // httplib would cut any 2xx body to the range, leaving a 200 with a fragment of JSON. The
        // request object is httplib's own non-const local; the handler is only given it as const.
        auto& mreq = const_cast<httplib::Request&>(req);
        mreq.ranges.clear();
        // HTTP/1.0: httplib closes the connection after the answer but announced `Keep-Alive` in it;
        // say `Connection: close` instead (RFC 9112 §9.3).
        if (req.version == "HTTP/1.0") close_after(req);
        // Framing a proxy in front may read otherwise (RFC 9112 §6.3, §5.1): both Transfer-Encoding and
        // Content-Length, a coding other than chunked, or a header name with a space before its colon (httplib kept
        // "Transfer-Encoding " as a name of its own and read the Content-Length): refused, and the connection ends.
        const auto refuse_framing = [&](const std::string& message, int status = 400) {
            close_after(req);
            set_error(res, api_error(status, message));
            return httplib::Server::HandlerResponse::Handled;
        };
        for (const auto& [name, value] : req.headers) {
            if (name.empty() || name.find_first_of(" \t") != std::string::npos)
                return refuse_framing("malformed HTTP request: whitespace in a header name");
        }
        // RFC 9112 §3.2: an HTTP/1.1 request without a Host header (or with several) is a 400.
        if (req.version == "HTTP/1.1" && req.get_header_value_count("Host") != 1)
            return refuse_framing("the request must have exactly one Host header");
        if (req.has_header("Transfer-Encoding")) {
            std::string te = req.get_header_value("Transfer-Encoding");
            std::transform(te.begin(), te.end(), te.begin(), [](unsigned char ch) { return std::tolower(ch); });
            if (req.get_header_value_count("Transfer-Encoding") != 1)
                return refuse_framing("Transfer-Encoding may be given once");
            if (te != "chunked")  // (RFC 9112 §6.1: a coding the server does not know is a 501)
                return refuse_framing("Transfer-Encoding '" + log_safe(te) + "' is not supported (only chunked)", 501);
            if (req.has_header("Content-Length"))
                return refuse_framing("a request may not have both Transfer-Encoding and Content-Length");
        }
        // A body httplib does not read (it reads those of POST, PUT and PATCH): the connection ends after the
        // answer, so that the body's bytes are never taken for a request (the GET's body ran as one).
        if (has_body(req) && req.method != "POST" && req.method != "PUT" && req.method != "PATCH") close_after(req);
        if (req.has_header("Transfer-Encoding")) close_after(req);  // (where its body ends is httplib's to know)
        // A target in absolute form (`GET http://host:port/health`, as proxies send) names the same
        // resource as its path (RFC 9112 §3.2.2: a server must accept it); httplib routes on the path.
        for (const std::string scheme : {"http://", "https://"}) {
            if (req.path.size() > scheme.size() &&
                std::equal(scheme.begin(), scheme.end(), req.path.begin(),
                           [](char a, char b) { return std::tolower(static_cast<unsigned char>(b)) == a; })) {
                const size_t slash = req.path.find('/', scheme.size());
                mreq.path = slash == std::string::npos ? "/" : req.path.substr(slash);
                break;
            }
        }
        if (refuse_without_key(keys, req, res) || refuse_encoding(req, res))
            return httplib::Server::HandlerResponse::Handled;
        return httplib::Server::HandlerResponse::Unhandled;
    });

    // Errors httplib produces itself (unknown route, body too large, malformed HTTP) get an
    // OpenAI error object too; responses that already have a body are left alone.
    const size_t max_body = options.max_body_bytes;
    svr.set_error_handler(
        httplib::Server::HandlerWithResponse([max_body](const httplib::Request& req, httplib::Response& res) {
            // A request httplib could not parse, or answered before its body was read (too large, an unknown
            // route's): the connection ends after the answer (RFC 9112 §9.6), and says so.
            if (t_stream != nullptr && (!t_stream->parsed() || t_stream->body_left())) close_after(req);
            if (!res.body.empty() || res.is_chunked_content_provider_)
                return httplib::Server::HandlerResponse::Unhandled;
            switch (res.status) {
                case 404: set_error(res, api_error(404, "unknown route " + req.method + " " + req.path)); break;
                case 413:
                    set_error(res, api_error(413,
                                             "the request body is larger than the limit of " +
                                                 std::to_string(max_body) + " bytes",
                                             "request_too_large"));
                    break;
                case 400: set_error(res, api_error(400, "malformed HTTP request")); break;
                default: set_error(res, api_error(res.status, "HTTP error " + std::to_string(res.status))); break;
            }
            return httplib::Server::HandlerResponse::Handled;
        }));
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        set_error(res, api_error(500, "internal error: " + what));
    });
    svr.set_logger([&metrics, log = options.access_log](const httplib::Request& req, const httplib::Response& res) {
        metrics.count_request(endpoint_label(req.path), res.status);
        if (log)
            std::fprintf(stderr, "[http] %s \"%s %s %s\" %d\n", log_safe(req.remote_addr).c_str(),
                         log_safe(req.method).c_str(), log_safe(req.path).c_str(), log_safe(req.version).c_str(),
                         res.status);
    });
    options_ = std::move(options);
}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::bind() {
    // A client that closes its socket must not kill the server with SIGPIPE on the next write.
    std::signal(SIGPIPE, SIG_IGN);
    GuardedServer& svr = impl_->svr;
    if (options_.port == 0) {
        port_ = svr.bind_to_any_port(options_.host);
        if (port_ < 0) return failed_precondition("cannot bind " + options_.host + " to a free port");
    } else {
        if (!svr.bind_to_port(options_.host, options_.port)) {
            return failed_precondition("cannot bind " + options_.host + ":" + std::to_string(options_.port) +
                                       " (in use, or not a local address?)");
        }
        port_ = options_.port;
    }
    // httplib listens with a backlog of 5; a burst of connections would then wait for SYN retries.
    if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, options_.listen_backlog);
    if (!impl_->pool)
        impl_->pool = std::make_unique<ConnectionPool>(static_cast<size_t>(std::max(options_.threads, 4)));
    return ok_status();
}

Status HttpServer::listen() {
    listening_.store(true);
    if (stop_requested_.load()) {
        listening_.store(false);
        return ok_status();
    }
    const bool ok = impl_->svr.listen_after_bind();
    listening_.store(false);
    if (!ok && !stop_requested_.load()) return internal_error("the HTTP server stopped with an error");
    return ok_status();
}

Status HttpServer::start() {
    RETURN_IF_ERROR(bind());
    thread_ = std::thread([this] { (void)listen(); });
    for (int i = 0; i < 10000 && !impl_->svr.is_running(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!impl_->svr.is_running()) return internal_error("the HTTP server did not start");
    return ok_status();
}

void HttpServer::stop() {
    stop_requested_.store(true);
    // httplib's stop() does nothing before the accept loop runs: wait for it if listen() is on
    // its way there.
    while (listening_.load() && !impl_->svr.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    impl_->svr.stop();
    if (thread_.joinable()) thread_.join();
}

}  // namespace gptoss::server
