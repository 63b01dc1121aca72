module volmgr/ffi/go/volmgr

go 1.19
