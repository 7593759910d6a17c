// A request's restriction of which tokens may come next (structured outputs). The engine creates
// one TokenConstraint per request from the request's factory, asks it before every draw and reports
// every token the request emits. Requests with a constraint take no speculative drafts; their draws run
// on the device under the mask where the runner can defer them (ModelRunner::can_defer_draws), else on
// the host (their logits come back from the device).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace gptoss::runtime {

class TokenConstraint {
public:
    virtual ~TokenConstraint() = default;
    // The tokens allowed next: returns false when every token is (`mask` untouched); else fills
    // mask[0, vocab_size) with 1 for an allowed token, 0 for another, at least one allowed.
    virtual bool allowed_next(std::vector<uint8_t>* mask) = 0;
    // The request emitted `id` (drawn under the last mask, or before any was asked).
    virtual void accept(int32_t id) = 0;
};

class TokenConstraintFactory {
public:
    virtual ~TokenConstraintFactory() = default;
    virtual std::unique_ptr<TokenConstraint> start() const = 0;
};

}  // namespace gptoss::runtime
