// The Vulkan backend's file as a build without libvulkan-dev and glslc compiles it: its stubs
// (CMakeLists.txt sluice_no_vulkan_check, built beside the real one so that build keeps compiling).
#undef SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend.cpp"
