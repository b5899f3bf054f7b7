// PythonHook: the BucketHook (nncomm/core/bucket_hook.hpp) of a Python
// callable; its call, in pyx/bucket_hooks.pxi, takes the GIL for the user's
// hook alone and releases it while the hook's collectives wait.
#pragma once

#include "nncomm/core/bucket_hook.hpp"

namespace nncomm {

class PythonHook : public BucketHook {
public:
  using Call = Status (*)(void *owner, const HookedBucket &bucket,
                          Transport &transport, const Polling &polling);

  // `owner`, the Python object that calls the hook, outlives this.
  PythonHook(Call call, void *owner) : call_(call), owner_(owner) {}

  Status reduce(const HookedBucket &bucket, Transport &transport,
                const Polling &polling) override {
    return call_(owner_, bucket, transport, polling);
  }

private:
  const Call call_;
  void *const owner_;
};

} // namespace nncomm
