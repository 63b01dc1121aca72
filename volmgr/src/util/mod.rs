//! Small helpers every layer uses: lock recovery, task supervision.
