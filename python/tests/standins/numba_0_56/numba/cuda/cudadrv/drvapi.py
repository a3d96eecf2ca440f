from ctypes import c_size_t

cu_device_ptr = c_size_t  # defined as unsigned long long
