// An error a request caused, with the HTTP status and the API error type to report. Thrown by
// request parsing and validation; the endpoint turns it into the error body of its API
// (OpenAI: {"error":{message,type,code}}, Anthropic: {"type":"error","error":{type,message}}).
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

#include "util/error.h"

namespace sluice::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message)
      : std::runtime_error(printable_message(message)), status(status), type(std::move(type)) {}
  int status;
  std::string type;
  int retry_after = 0;  // seconds; > 0 adds a Retry-After header (503)
  // The reason /metrics counts the refusal under (sluice_requests_rejected_total), where the
  // status alone would name the wrong one; nullptr: from the status.
  const char* refusal = nullptr;
};

inline ApiError bad_request(const std::string& message) { return ApiError(400, "invalid_request_error", message); }

}  // namespace sluice::server
