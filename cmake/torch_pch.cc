// Anchor for the libtorch precompiled header (see ChorusTargets.cmake).
