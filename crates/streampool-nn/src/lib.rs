//! Layers and models on the streampool runtime (work in progress).
