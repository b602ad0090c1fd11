#include "codec/range_reader.h"

#include <string>
#include <utility>

namespace deltacast::codec {

RangeReader ReadFromSpans(std::function<ByteSpan(size_t)> tensor_data) {
  return
      [tensor_data = std::move(tensor_data)](size_t tensor, uint64_t byte_offset, uint64_t length,
                                             MutableByteSpan) -> Result<ByteSpan> {
        const ByteSpan all = tensor_data(tensor);
        if (byte_offset > all.size() || length > all.size() - byte_offset) {
          return Status::InvalidArgument("bytes [" + std::to_string(byte_offset) + ", +" +
                                         std::to_string(length) + ") lie outside tensor " +
                                         std::to_string(tensor) + " of " +
                                         std::to_string(all.size()) + " bytes");
        }
        return all.subspan(byte_offset, length);
      };
}

}  // namespace deltacast::codec
