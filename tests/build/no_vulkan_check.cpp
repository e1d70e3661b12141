// The Vulkan backend's files as a build without libvulkan-dev and glslc compiles them: the
// backend's stubs, and nothing of the others (CMakeLists.txt sluice_no_vulkan_check, built
// beside the real ones so that build keeps compiling).
#undef SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend.cpp"
#include "backend/vulkan_device.cpp"
#include "backend/vulkan_shaders.cpp"
