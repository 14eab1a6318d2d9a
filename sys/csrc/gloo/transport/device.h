// Stand-in: see README.md in this folder.
#pragma once

namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
} // namespace transport
} // namespace gloo
