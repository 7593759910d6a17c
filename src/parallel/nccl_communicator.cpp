#include "parallel/nccl_communicator.h"

#include <cstdlib>
#include <map>

#if GPTOSS_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>

#include <mutex>
#endif

namespace gptoss::parallel {

#if GPTOSS_HAVE_NCCL

namespace {

// The NCCL entry points we use, resolved from the shared library.
struct NcclApi {
    decltype(&ncclGetErrorString) get_error_string = nullptr;
    decltype(&ncclGetVersion) get_version = nullptr;
    decltype(&ncclCommInitAll) comm_init_all = nullptr;
    decltype(&ncclCommDestroy) comm_destroy = nullptr;
    decltype(&ncclAllReduce) all_reduce = nullptr;
    decltype(&ncclAllGather) all_gather = nullptr;
    decltype(&ncclReduceScatter) reduce_scatter = nullptr;
    decltype(&ncclBroadcast) broadcast = nullptr;
    decltype(&ncclSend) send = nullptr;
    decltype(&ncclRecv) recv = nullptr;
    decltype(&ncclGroupStart) group_start = nullptr;
    decltype(&ncclGroupEnd) group_end = nullptr;
    std::string error;  // why loading failed ("" when it worked)
};

const NcclApi& api() {
    static NcclApi a;
    static std::once_flag once;
    std::call_once(once, [] {
        const char* env = std::getenv("GPTOSS_NCCL_LIBRARY");
        const char* name = env && *env ? env : "libnccl.so.2";
        void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char* e = dlerror();
            a.error = std::string("cannot load ") + name + ": " + (e ? e : "unknown error") +
                      " (set GPTOSS_NCCL_LIBRARY to the path of libnccl.so.2)";
            return;
        }
        bool missing = false;
        auto sym = [&](auto& fn, const char* s) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, s));
            if (!fn) {
                missing = true;
                a.error += std::string(a.error.empty() ? "" : ", ") + s;
            }
        };
        sym(a.get_error_string, "ncclGetErrorString");
        sym(a.get_version, "ncclGetVersion");
        sym(a.comm_init_all, "ncclCommInitAll");
        sym(a.comm_destroy, "ncclCommDestroy");
        sym(a.all_reduce, "ncclAllReduce");
        sym(a.all_gather, "ncclAllGather");
        sym(a.reduce_scatter, "ncclReduceScatter");
        sym(a.broadcast, "ncclBroadcast");
        sym(a.send, "ncclSend");
        sym(a.recv, "ncclRecv");
        sym(a.group_start, "ncclGroupStart");
        sym(a.group_end, "ncclGroupEnd");
        if (missing) a.error = std::string(name) + " lacks " + a.error;
    });
    return a;
}

Status nccl_status(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return ok_status();
    return internal_error(std::string(what) + " failed: " + api().get_error_string(r));
}

StatusOr<ncclDataType_t> nccl_type(DType dtype) {
    switch (dtype) {
        case DType::kF32: return ncclFloat32;
        case DType::kBF16: return ncclBfloat16;
        case DType::kI32: return ncclInt32;
        default: return invalid_argument("collective dtype " + std::string(dtype_name(dtype)) + " is not supported");
    }
}

// One communicator shared by the ranks' handles, destroyed with the last handle.
struct CommHolder {
    ncclComm_t comm = nullptr;
    ~CommHolder() {
        if (comm) api().comm_destroy(comm);
    }
};

class NcclCommunicator final : public Communicator {
public:
    NcclCommunicator(std::shared_ptr<CommHolder> c, int rank, int size) : c_(std::move(c)), rank_(rank), size_(size) {}
    int rank() const override { return rank_; }
    int size() const override { return size_; }

    Status all_reduce_sum(void* data, size_t count, DType dtype, void* stream) override {
        ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
        if (size_ == 1) return ok_status();
        return nccl_status(api().all_reduce(data, data, count, t, ncclSum, c_->comm, cuda_stream(stream)),
                           "ncclAllReduce");
    }
    Status all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
        ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
        return nccl_status(api().all_gather(send, recv, count, t, c_->comm, cuda_stream(stream)), "ncclAllGather");
    }
    Status reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
        ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
        return nccl_status(api().reduce_scatter(send, recv, count, t, ncclSum, c_->comm, cuda_stream(stream)),
                           "ncclReduceScatter");
    }
    Status all_to_all(const void* send, void* recv, size_t count, DType dtype, void* stream) override {
        ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
        const size_t bytes = count * collective_dtype_bytes(dtype);
        RETURN_IF_ERROR(nccl_status(api().group_start(), "ncclGroupStart"));
        for (int r = 0; r < size_; ++r) {
            Status s = nccl_status(
                api().send(static_cast<const uint8_t*>(send) + r * bytes, count, t, r, c_->comm, cuda_stream(stream)),
                "ncclSend");
            if (s.ok()) {
                s = nccl_status(
                    api().recv(static_cast<uint8_t*>(recv) + r * bytes, count, t, r, c_->comm, cuda_stream(stream)),
                    "ncclRecv");
            }
            if (!s.ok()) {
                (void)api().group_end();
                return s;
            }
        }
        return nccl_status(api().group_end(), "ncclGroupEnd");
    }
    Status broadcast(void* data, size_t bytes, int root, void* stream) override {
        if (root < 0 || root >= size_) return invalid_argument("broadcast root out of range");
        return nccl_status(api().broadcast(data, data, bytes, ncclUint8, root, c_->comm, cuda_stream(stream)),
                           "ncclBroadcast");
    }

private:
    static cudaStream_t cuda_stream(void* s) { return static_cast<cudaStream_t>(s); }
    std::shared_ptr<CommHolder> c_;
    int rank_, size_;
};

// Communicators for the group of ranks `ranks` (devices[ranks[i]] is member i).
StatusOr<std::vector<std::shared_ptr<CommHolder>>> init_group(const std::vector<int>& ranks,
                                                              std::span<const int> devices) {
    std::vector<int> devs;
    for (int r : ranks) devs.push_back(devices[r]);
    std::vector<ncclComm_t> comms(devs.size());
    RETURN_IF_ERROR(
        nccl_status(api().comm_init_all(comms.data(), static_cast<int>(devs.size()), devs.data()), "ncclCommInitAll"));
    std::vector<std::shared_ptr<CommHolder>> out;
    for (ncclComm_t c : comms) {
        auto h = std::make_shared<CommHolder>();
        h->comm = c;
        out.push_back(std::move(h));
    }
    return out;
}

}  // namespace

bool nccl_available(std::string* why) {
    const NcclApi& a = api();
    if (!a.error.empty()) {
        if (why) *why = a.error;
        return false;
    }
    return true;
}

StatusOr<std::vector<RankComms>> make_nccl_world(const ParallelConfig& config, std::span<const int> devices) {
    RETURN_IF_ERROR(config.validate());
    const int n = config.world_size();
    if (static_cast<int>(devices.size()) != n) {
        return invalid_argument(config.to_string() + " needs " + std::to_string(n) + " devices, got " +
                                std::to_string(devices.size()));
    }
    std::string why;
    if (!nccl_available(&why)) return failed_precondition(why);
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // multicast off unless the user insists
    std::vector<RankComms> out(n);
    std::vector<int> all(n);
    for (int r = 0; r < n; ++r) all[r] = r;
    ASSIGN_OR_RETURN(auto world, init_group(all, devices));
    std::map<int, std::vector<std::shared_ptr<CommHolder>>> tp_groups, dp_groups;
    for (int r = 0; r < n; ++r) {
        out[r].rank = r;
        out[r].world = std::make_unique<NcclCommunicator>(world[r], r, n);
        const RankLayout lay = rank_layout(config, r);
        const std::vector<int> tp = tp_group_ranks(config, r), dp = dp_group_ranks(config, r);
        if (!tp_groups.count(tp.front())) {
            ASSIGN_OR_RETURN(tp_groups[tp.front()], init_group(tp, devices));
        }
        if (!dp_groups.count(dp.front())) {
            ASSIGN_OR_RETURN(dp_groups[dp.front()], init_group(dp, devices));
        }
        out[r].tp = std::make_unique<NcclCommunicator>(tp_groups[tp.front()][lay.tp_rank], lay.tp_rank, config.tp);
        out[r].dp = std::make_unique<NcclCommunicator>(dp_groups[dp.front()][lay.dp_rank], lay.dp_rank, config.dp);
    }
    return out;
}

#else  // built without nccl.h

bool nccl_available(std::string* why) {
    if (why) *why = "this build has no NCCL support (nccl.h was not found at configure time)";
    return false;
}

StatusOr<std::vector<RankComms>> make_nccl_world(const ParallelConfig&, std::span<const int>) {
    return failed_precondition("this build has no NCCL support (nccl.h was not found at configure time)");
}

#endif

}  // namespace gptoss::parallel
