// Anchors the precompiled header target; the tests link its object into every executable.
#include "pch.hpp"
