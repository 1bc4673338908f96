"""attnserve's Python client: `Client` (numpy in and out, fp32 or bf16) over the
generated stubs in `attnserve.v1`."""
from attnserve.client import (Client, bf16_to_float32, float32_to_bf16, from_tensor,
                              to_tensor)

__all__ = ["Client", "bf16_to_float32", "float32_to_bf16", "from_tensor", "to_tensor"]
