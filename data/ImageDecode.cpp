// JPEG (libjpeg-turbo's libjpeg API) and PNG (libpng) decoding into f32 (height, width, 3).
//
// Both libraries report an error through a callback that must not return. Ours longjmps back to
// a setjmp in a `guarded` call, whose steps are C calls and loops over plain data, so the jump
// skips no destructor; the libraries' state is owned by an object declared before (and so
// destroyed after) every jump, and each failure becomes a weft::Error naming the file.
#include "data/ImageFolder.h"

#include "core/Error.h"
#include "core/Escape.h"
#include "core/InputFile.h"

#ifdef WEFT_HAVE_IMAGE_FILES
#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which uses FILE without including it
#include <cstring>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>
#endif

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace weft::data {

#ifdef WEFT_HAVE_IMAGE_FILES

namespace {

/// Runs `step` under `jump`: false when a library callback jumped back.
template <class Step>
bool guarded(std::jmp_buf& jump, Step&& step) {
  if (setjmp(jump)) return false;
  step();
  return true;
}

void checkDimensions(const std::string& name, const char* format, uint64_t width, uint64_t height) {
  const auto side = static_cast<uint64_t>(kMaxImageSide);
  WEFT_CHECK(
      width >= 1 && height >= 1 && width <= side && height <= side &&
          width * height <= static_cast<uint64_t>(kMaxImagePixels),
      "image file '{}': a {} image of {} x {} pixels; each side must be in 1..{} and the image at most {} pixels", name,
      format, width, height, side, kMaxImagePixels);
}

/// Row y of 8-bit RGB samples into an f32 (height, width, 3) tensor.
void storeRow(const uint8_t* row, int64_t width, int64_t y, float* out) {
  float* dst = out + y * width * 3;
  for (int64_t k = 0; k < width * 3; ++k) dst[k] = static_cast<float>(row[k]);
}

/// RGB from inks as PIL converts them: each channel (255 - ink) (255 - black) / 255. Adobe's
/// files, most CMYK JPEGs, store the inks inverted.
void storeCmykRow(const uint8_t* row, int64_t width, int64_t y, bool inverted, float* out) {
  float* dst = out + y * width * 3;
  for (int64_t x = 0; x < width; ++x) {
    const uint8_t* ink = row + 4 * x;
    const auto paper = [&](int k) { return static_cast<float>(inverted ? ink[k] : 255 - ink[k]); };
    for (int c = 0; c < 3; ++c) dst[3 * x + c] = paper(c) * paper(3) / 255.0f;
  }
}

/// libjpeg's error manager, with where to jump and the message of the failure.
struct JpegErrors {
  jpeg_error_mgr manager;  // first: libjpeg passes a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpegFail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  info->err->format_message(info, errors->message);
  std::longjmp(errors->jump, 1);
}

/// Warnings (level -1) tell of corruption libjpeg worked around, which PIL tolerates too, except
/// for data ending early: libjpeg would fill the rest of a truncated file with grey.
void jpegMessage(j_common_ptr info, int level) {
  if (level < 0 && info->err->msg_code == JWRN_JPEG_EOF) jpegFail(info);
}

struct JpegDecoder {
  jpeg_decompress_struct info{};
  JpegErrors errors{};
  JpegDecoder() {
    info.err = jpeg_std_error(&errors.manager);
    errors.manager.error_exit = jpegFail;
    errors.manager.emit_message = jpegMessage;
  }
  ~JpegDecoder() { jpeg_destroy_decompress(&info); }  // a no-op before jpeg_create_decompress
};

Tensor decodeJpeg(const std::string& name, const std::string& bytes) {
  JpegDecoder d;
  const auto fail = [&] { WEFT_THROW("image file '{}': not a readable JPEG: {}", name, d.errors.message); };
  if (!guarded(d.errors.jump, [&] {
        jpeg_create_decompress(&d.info);
        jpeg_mem_src(&d.info, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
        jpeg_read_header(&d.info, TRUE);
      }))
    fail();
  checkDimensions(name, "JPEG", d.info.image_width, d.info.image_height);
  // A few photographs (some of ImageNet's) are CMYK: libjpeg gives the inks, converted here.
  const bool cmyk = d.info.jpeg_color_space == JCS_CMYK || d.info.jpeg_color_space == JCS_YCCK;
  d.info.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  const bool inverted = cmyk && d.info.saw_Adobe_marker;
  const int64_t width = d.info.image_width, height = d.info.image_height;
  Tensor pixels(f32, {height, width, 3});
  std::vector<JSAMPLE> row(static_cast<size_t>(width) * (cmyk ? 4 : 3));
  JSAMPROW rows[1] = {row.data()};
  float* out = pixels.data<float>();
  if (!guarded(d.errors.jump, [&] {
        jpeg_start_decompress(&d.info);
        while (d.info.output_scanline < d.info.output_height) {
          const int64_t y = d.info.output_scanline;
          jpeg_read_scanlines(&d.info, rows, 1);
          if (cmyk) storeCmykRow(rows[0], width, y, inverted, out);
          else storeRow(rows[0], width, y, out);
        }
        jpeg_finish_decompress(&d.info);
      }))
    fail();
  return pixels;
}

/// libpng's state, the bytes it reads from, where to jump and the message of the failure.
struct PngDecoder {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const std::string* bytes = nullptr;
  size_t offset = 0;
  std::jmp_buf jump;
  std::array<char, 256> message{};
  ~PngDecoder() { png_destroy_read_struct(&png, &info, nullptr); }  // either may be null
};

void pngFail(png_structp png, png_const_charp message) {
  auto* d = static_cast<PngDecoder*>(png_get_error_ptr(png));
  std::snprintf(d->message.data(), d->message.size(), "%s", message);
  std::longjmp(d->jump, 1);
}

/// Warnings tell of ancillary chunks libpng skipped; PIL ignores them too.
void pngWarn(png_structp, png_const_charp) {}

void pngRead(png_structp png, png_bytep out, size_t count) {
  auto* d = static_cast<PngDecoder*>(png_get_io_ptr(png));
  if (count > d->bytes->size() - d->offset) png_error(png, "the file ends early");
  std::memcpy(out, d->bytes->data() + d->offset, count);
  d->offset += count;
}

Tensor decodePng(const std::string& name, const std::string& bytes) {
  PngDecoder d;
  d.bytes = &bytes;
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d, pngFail, pngWarn);
  if (d.png) d.info = png_create_info_struct(d.png);
  WEFT_CHECK(d.png && d.info, "image file '{}': libpng could not allocate its state", name);
  png_set_read_fn(d.png, &d, pngRead);
  const auto fail = [&] { WEFT_THROW("image file '{}': not a readable PNG: {}", name, d.message.data()); };
  if (!guarded(d.jump, [&] { png_read_info(d.png, d.info); })) fail();
  const int64_t width = png_get_image_width(d.png, d.info), height = png_get_image_height(d.png, d.info);
  checkDimensions(name, "PNG", static_cast<uint64_t>(width), static_cast<uint64_t>(height));
  // 8-bit RGB from every kind: palettes and grey expanded, 16 bits cut to their high byte and
  // alpha dropped (as PIL's convert("RGB") does), interlaced passes merged.
  if (!guarded(d.jump, [&] {
        png_set_expand(d.png);
        png_set_strip_16(d.png);
        png_set_strip_alpha(d.png);
        png_set_gray_to_rgb(d.png);
        png_set_interlace_handling(d.png);
        png_read_update_info(d.png, d.info);
      }))
    fail();
  const size_t rowBytes = png_get_rowbytes(d.png, d.info);
  WEFT_CHECK(rowBytes == static_cast<size_t>(width) * 3,
             "image file '{}': libpng gives rows of {} bytes for {} RGB pixels", name, rowBytes, width);
  std::vector<uint8_t> samples(rowBytes * static_cast<size_t>(height));
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (size_t y = 0; y < rows.size(); ++y) rows[y] = samples.data() + y * rowBytes;
  if (!guarded(d.jump, [&] {
        png_read_image(d.png, rows.data());
        png_read_end(d.png, nullptr);
      }))
    fail();
  Tensor pixels(f32, {height, width, 3});
  for (int64_t y = 0; y < height; ++y) storeRow(rows[static_cast<size_t>(y)], width, y, pixels.data<float>());
  return pixels;
}

bool startsWith(const std::string& bytes, std::initializer_list<uint8_t> magic) {
  if (bytes.size() < magic.size()) return false;
  size_t k = 0;
  for (const uint8_t b : magic)
    if (static_cast<uint8_t>(bytes[k++]) != b) return false;
  return true;
}

}  // namespace

bool imageFilesSupported() { return true; }

Tensor decodeImage(const std::string& file) {
  InputFile in(file, "image file", kMaxImageFileBytes);
  const std::string bytes = in.readAll();
  if (startsWith(bytes, {0xff, 0xd8, 0xff})) return decodeJpeg(in.name(), bytes);
  if (startsWith(bytes, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'})) return decodePng(in.name(), bytes);
  std::string head;
  for (size_t k = 0; k < std::min<size_t>(bytes.size(), 8); ++k)
    head += fmt::format("{}{:02x}", k ? " " : "", static_cast<uint8_t>(bytes[k]));
  WEFT_THROW("image file '{}' is neither a JPEG nor a PNG: it starts with bytes [{}] ({} bytes in all)", in.name(),
             head, bytes.size());
}

#else

bool imageFilesSupported() { return false; }

Tensor decodeImage(const std::string& file) {
  WEFT_THROW("cannot decode '{}': this weft was built without JPEG/PNG support (libjpeg62-turbo-dev, libpng-dev)",
             escapeBytes(file, 4096));
}

#endif

}  // namespace weft::data
