#ifndef ATTNSERVE_TRANSPORT_TRANSPORT_H_
#define ATTNSERVE_TRANSPORT_TRANSPORT_H_

// What makes tensors cross a loopback or LAN connection at wire speed, for both ends.
//
// Measured by `make bench-server`: a 256 KiB gRPC message costs ~2.5 ms with
// glibc's defaults because every multi-hundred-KiB buffer is a fresh mmap,
// zero-filled by page faults, and munmapped when freed; and gRPC reads a large message in
// small chunks. The server calls both functions at start-up; attnctl, attnbench and
// programs using the client library do the same.

#include <cstdint>

#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace attnserve::transport {

// Tells glibc malloc to serve buffers up to kMallocMmapThreshold from its heap and to
// keep up to kMallocTrimThreshold of freed memory instead of returning it to the kernel
// at once, so a steady request stream reuses pages instead of faulting new ones in.
// Memory stays bounded by the peak the process actually used (which the server's budgets
// bound). Call once, at start-up, before threads start. A no-op under another allocator.
// Returns false if glibc refused a setting.
bool KeepAllocatorMemory();

// Hands the allocator's free memory back to the system now (glibc's malloc_trim): once,
// after the models are loaded, whose loading frees copies of the weights (tens of MB
// for an encoder) that KeepAllocatorMemory's thresholds would otherwise keep.
void ReturnFreedMemory();

inline constexpr int64_t kMallocMmapThreshold = int64_t{32} << 20;  // glibc's maximum
inline constexpr int64_t kMallocTrimThreshold = int64_t{256} << 20;
inline constexpr int64_t kMallocTopPad = int64_t{16} << 20;

// gRPC reads a socket into 8 KiB..256 KiB slices by default; a 256 KiB message then takes
// dozens of reads and slice copies. These read chunks let one read take a whole message.
inline constexpr int kTcpReadChunkBytes = 1 << 20;
inline constexpr int kTcpMinReadChunkBytes = 256 << 10;
inline constexpr int kTcpMaxReadChunkBytes = 4 << 20;

// Sets the read-chunk arguments (callers' own arguments, set later, still win).
void ApplyTransportDefaults(grpc::ChannelArguments& arguments);
void ApplyTransportDefaults(grpc::ServerBuilder& builder);

}  // namespace attnserve::transport

#endif  // ATTNSERVE_TRANSPORT_TRANSPORT_H_
