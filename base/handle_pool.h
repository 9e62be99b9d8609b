// HandlePool: reusable driver handles (CUDA events), so that hot paths do not create and
// destroy one per use (review F16, F18). take() hands out a shared_ptr that returns the
// handle to the pool when the last holder lets go; handles still held when the pool is
// gone are destroyed instead. `Handle` is a pointer type (cudaEvent_t); create() makes one
// (throwing on failure), destroy() frees one (never throws).
// Thread safety: take() and the returns are safe from any thread.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

namespace ferry {

template <class Handle>
class HandlePool {
 public:
  using Object = std::remove_pointer_t<Handle>;
  static std::shared_ptr<HandlePool> make(std::function<Handle()> create, std::function<void(Handle)> destroy) {
    auto p = std::shared_ptr<HandlePool>(new HandlePool(std::move(create), std::move(destroy)));
    p->self_ = p;
    return p;
  }
  ~HandlePool() {
    for (Handle h : free_) destroy_(h);
  }
  HandlePool(const HandlePool&) = delete;
  HandlePool& operator=(const HandlePool&) = delete;

  std::shared_ptr<Object> take() {
    Handle h{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        h = free_.back();
        free_.pop_back();
      }
    }
    if (!h) h = create_();
    return std::shared_ptr<Object>(h, [self = self_, destroy = destroy_](Handle x) {
      if (auto pool = self.lock()) {
        std::lock_guard<std::mutex> lock(pool->mu_);
        pool->free_.push_back(x);
      } else {
        destroy(x);
      }
    });
  }

 private:
  HandlePool(std::function<Handle()> create, std::function<void(Handle)> destroy)
      : create_(std::move(create)), destroy_(std::move(destroy)) {}
  std::function<Handle()> create_;
  std::function<void(Handle)> destroy_;
  std::mutex mu_;
  std::vector<Handle> free_;
  std::weak_ptr<HandlePool> self_;
};

}  // namespace ferry
