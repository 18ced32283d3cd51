// Private: the S3 XML documents xsilo reads, as functions of the text
// alone, so that they can be fuzzed (fuzz/fuzz_s3_xml.cpp) and unit-tested
// apart from the server and the client that use them.
#pragma once

#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/status.h"
#include "xsilo/s3/client.h"

namespace xsilo::s3 {

// One <Part> of a CompleteMultipartUpload body.
struct CompletedPart {
  int number = 0;    // 0 .. 99999 as written (S3 allows 1 .. 10000)
  std::string etag;  // unescaped, surrounding quotes removed
};

// Server side: the parts a CompleteMultipartUpload body lists, in document
// order. InvalidArgument (answered as MalformedXML) when a part lacks its
// number or ETag, a number is not 1 to 5 decimal digits, or no part is
// listed. Order and existence are checked by the caller.
Result<std::vector<CompletedPart>> ParseCompleteMultipartUpload(std::string_view body);

// Client side: one page of a ListObjectsV2 response. Appends the page's
// objects and common prefixes to *out (keys and prefixes url-decoded when
// the page says EncodingType url) and sets truncated and
// next_continuation_token. Internal when the document is not a
// ListBucketResult or an object's Size is not a decimal byte count.
Status ParseListObjectsV2(std::string_view doc, ListObjectsResult* out);

// "2013-05-24T00:00:00.000Z" (fraction and zone ignored); 0 if malformed.
std::time_t ParseIsoDate(std::string_view s);

}  // namespace xsilo::s3
