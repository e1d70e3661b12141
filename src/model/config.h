// deepseek41's ModelConfig moved to model/deepseek41/config.h. This header is kept only for the
// forward-pass files (forward.h, primitives.h), which are being rewritten and will include the
// new path when they move under model/deepseek41/ too; new code includes that path directly.
#pragma once
#include "model/deepseek41/config.h"
