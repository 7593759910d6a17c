#include "parallel/local_communicator.h"

#include <barrier>
#include <cstring>
#include <map>

#include "core/check.h"

namespace gptoss::parallel {

size_t collective_dtype_bytes(DType dtype) {
    switch (dtype) {
        case DType::kF32:
        case DType::kI32: return 4;
        case DType::kBF16: return 2;
        default: return 0;
    }
}

struct LocalGroup::State {
    explicit State(int n) : size(n), barrier(n), send(n), recv(n) {}
    int size;
    std::barrier<> barrier;
    std::vector<const void*> send;  // published by each rank for the current collective
    std::vector<void*> recv;
};

namespace {

float load(const void* p, size_t i, DType dtype) {
    if (dtype == DType::kF32) return static_cast<const float*>(p)[i];
    return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

void store(void* p, size_t i, float v, DType dtype) {
    if (dtype == DType::kF32) {
        static_cast<float*>(p)[i] = v;
    } else {
        static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
    }
}

Status check_dtype(DType dtype, bool reduce) {
    if (collective_dtype_bytes(dtype) == 0 || (reduce && dtype == DType::kI32)) {
        return invalid_argument("collective dtype " + std::string(dtype_name(dtype)) + " is not supported");
    }
    return ok_status();
}

class LocalCommunicator final : public Communicator {
public:
    LocalCommunicator(std::shared_ptr<LocalGroup::State> s, int rank) : s_(std::move(s)), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return s_->size; }

    Status all_reduce_sum(void* data, size_t count, DType dtype, void*) override {
        RETURN_IF_ERROR(check_dtype(dtype, true));
        if (s_->size == 1) return ok_status();
        publish(data, data);
        std::vector<float> sum(count, 0.0f);
        for (int r = 0; r < s_->size; ++r)  // rank order: every rank computes the same sums
            for (size_t i = 0; i < count; ++i) sum[i] += load(s_->send[r], i, dtype);
        s_->barrier.arrive_and_wait();  // nobody reads the inputs any more
        for (size_t i = 0; i < count; ++i) store(data, i, sum[i], dtype);
        return ok_status();
    }

    Status all_gather(const void* send, void* recv, size_t count, DType dtype, void*) override {
        RETURN_IF_ERROR(check_dtype(dtype, false));
        const size_t bytes = count * collective_dtype_bytes(dtype);
        publish(send, recv);
        // Copy into our own recv only; others' send buffers stay valid until the closing barrier.
        std::vector<uint8_t> tmp(bytes * s_->size);
        for (int r = 0; r < s_->size; ++r) std::memcpy(tmp.data() + r * bytes, s_->send[r], bytes);
        s_->barrier.arrive_and_wait();
        std::memcpy(recv, tmp.data(), tmp.size());
        return ok_status();
    }

    Status reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype, void*) override {
        RETURN_IF_ERROR(check_dtype(dtype, true));
        publish(send, recv);
        std::vector<float> sum(count, 0.0f);
        const size_t offset = static_cast<size_t>(rank_) * count;
        for (int r = 0; r < s_->size; ++r)
            for (size_t i = 0; i < count; ++i) sum[i] += load(s_->send[r], offset + i, dtype);
        s_->barrier.arrive_and_wait();
        for (size_t i = 0; i < count; ++i) store(recv, i, sum[i], dtype);
        return ok_status();
    }

    Status all_to_all(const void* send, void* recv, size_t count, DType dtype, void*) override {
        RETURN_IF_ERROR(check_dtype(dtype, false));
        const size_t bytes = count * collective_dtype_bytes(dtype);
        publish(send, recv);
        std::vector<uint8_t> tmp(bytes * s_->size);
        for (int r = 0; r < s_->size; ++r)
            std::memcpy(tmp.data() + r * bytes, static_cast<const uint8_t*>(s_->send[r]) + rank_ * bytes, bytes);
        s_->barrier.arrive_and_wait();
        std::memcpy(recv, tmp.data(), tmp.size());
        return ok_status();
    }

    Status broadcast(void* data, size_t bytes, int root, void*) override {
        if (root < 0 || root >= s_->size) return invalid_argument("broadcast root out of range");
        publish(data, data);
        std::vector<uint8_t> tmp(bytes);
        if (rank_ != root) std::memcpy(tmp.data(), s_->send[root], bytes);
        s_->barrier.arrive_and_wait();
        if (rank_ != root) std::memcpy(data, tmp.data(), bytes);
        return ok_status();
    }

private:
    // Publishes this rank's buffers and waits until every rank has published its own.
    void publish(const void* send, void* recv) {
        // Safe without a leading barrier: slots are only read between this barrier and the
        // collective's closing one, which every rank passed before it could publish again.
        s_->send[rank_] = send;
        s_->recv[rank_] = recv;
        s_->barrier.arrive_and_wait();
    }

    std::shared_ptr<LocalGroup::State> s_;
    int rank_;
};

}  // namespace

LocalGroup::LocalGroup(int size) : state_(std::make_shared<State>(size)) { ENGINE_CHECK(size >= 1, "empty group"); }
LocalGroup::~LocalGroup() = default;
int LocalGroup::size() const { return state_->size; }

std::unique_ptr<Communicator> LocalGroup::communicator(int rank) {
    ENGINE_CHECK(rank >= 0 && rank < state_->size, "rank out of range");
    return std::make_unique<LocalCommunicator>(state_, rank);
}

std::vector<RankComms> make_local_world(const ParallelConfig& config) {
    const int n = config.world_size();
    std::vector<RankComms> out(n);
    LocalGroup world(n);
    std::map<int, std::unique_ptr<LocalGroup>> tp_groups, dp_groups;  // keyed by the group's first rank
    for (int r = 0; r < n; ++r) {
        out[r].rank = r;
        out[r].world = world.communicator(r);
        const std::vector<int> tp = tp_group_ranks(config, r), dp = dp_group_ranks(config, r);
        auto& tg = tp_groups[tp.front()];
        if (!tg) tg = std::make_unique<LocalGroup>(static_cast<int>(tp.size()));
        out[r].tp = tg->communicator(rank_layout(config, r).tp_rank);
        auto& dg = dp_groups[dp.front()];
        if (!dg) dg = std::make_unique<LocalGroup>(static_cast<int>(dp.size()));
        out[r].dp = dg->communicator(rank_layout(config, r).dp_rank);
    }
    return out;
}

}  // namespace gptoss::parallel
