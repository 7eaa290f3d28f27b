"""Where it runs: device properties and signatures, runtimes, arrays, timers, simulated devices, FlatBuffers."""
