#include "transport/transport.h"

#include <malloc.h>

namespace attnserve::transport {

bool KeepAllocatorMemory() {
  bool ok = true;
  ok &= mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThreshold)) == 1;
  ok &= mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocTrimThreshold)) == 1;
  ok &= mallopt(M_TOP_PAD, static_cast<int>(kMallocTopPad)) == 1;
  return ok;
}

void ReturnFreedMemory() { malloc_trim(0); }

void ApplyTransportDefaults(grpc::ChannelArguments& arguments) {
  arguments.SetInt("grpc.experimental.tcp_read_chunk_size", kTcpReadChunkBytes);
  arguments.SetInt("grpc.experimental.tcp_min_read_chunk_size", kTcpMinReadChunkBytes);
  arguments.SetInt("grpc.experimental.tcp_max_read_chunk_size", kTcpMaxReadChunkBytes);
}

void ApplyTransportDefaults(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument("grpc.experimental.tcp_read_chunk_size", kTcpReadChunkBytes);
  builder.AddChannelArgument("grpc.experimental.tcp_min_read_chunk_size",
                             kTcpMinReadChunkBytes);
  builder.AddChannelArgument("grpc.experimental.tcp_max_read_chunk_size",
                             kTcpMaxReadChunkBytes);
}

}  // namespace attnserve::transport
