//! Plans: a validated manifest expanded into runs, processes, shards and cache directories.
