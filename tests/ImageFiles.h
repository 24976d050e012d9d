// JPEG encoding for tests and fuzz seeds: images the decoders (data/ImageFolder.h) must read,
// written with libjpeg itself. Needs WEFT_HAVE_IMAGE_FILES and JPEG::JPEG.
#pragma once

#include <jpeglib.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace weft::testing {

/// The JPEG of `samples` (row-major, `channels` interleaved: 3 RGB, 1 grey, 4 CMYK, which
/// libjpeg writes with Adobe's marker) at `quality`, without chroma subsampling.
inline std::string jpegBytes(int width, int height, int channels, const std::vector<uint8_t>& samples, int quality,
                             bool progressive = false) {
  jpeg_compress_struct info{};
  jpeg_error_mgr errors{};
  info.err = jpeg_std_error(&errors);
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&info, &buffer, &size);
  info.image_width = static_cast<JDIMENSION>(width);
  info.image_height = static_cast<JDIMENSION>(height);
  info.input_components = channels;
  info.in_color_space = channels == 3 ? JCS_RGB : channels == 1 ? JCS_GRAYSCALE : JCS_CMYK;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  if (progressive) jpeg_simple_progression(&info);
  for (int c = 0; c < info.num_components; ++c) info.comp_info[c].h_samp_factor = info.comp_info[c].v_samp_factor = 1;
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(samples.data() + info.next_scanline * static_cast<size_t>(width * channels));
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::string bytes(reinterpret_cast<const char*>(buffer), size);
  std::free(buffer);
  return bytes;
}

}  // namespace weft::testing
