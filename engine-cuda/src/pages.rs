//! Page spaces on the GPU: each space the engine maps (its local pool, an arena attachment) is
//! host memory the kernels read and write in place. It is registered with the driver
//! (`cuMemHostRegister`, device-mapped), which on unified memory (Jetson Thor) is the design's
//! zero-copy path and on a discrete GPU reaches the pages over PCIe: correct, and the device
//! page pool with the arena as its host tier replaces it there. The backend's private pages
//! (KV that lives only in the model, e.g. an MTP head's) are device memory.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, result, sys};
use engine_ops::kv::{HostPages, PageId};

use crate::CudaError;
use crate::device::GpuDevice;
use crate::space::SpaceTable;

/// The space id of private pages (as on the CPU).
pub const PRIVATE_SPACE: u32 = u32::MAX;

struct Registered {
    memory: Arc<dyn HostPages>,
}

pub struct PageSpaces {
    dev: Arc<GpuDevice>,
    table: SpaceTable,
    registered: HashMap<u32, Registered>,
    private: Vec<Option<CudaSlice<u8>>>,
    free_private: Vec<u32>,
}

fn driver(e: result::DriverError) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

impl PageSpaces {
    pub fn new(dev: Arc<GpuDevice>) -> PageSpaces {
        PageSpaces {
            dev,
            table: SpaceTable::default(),
            registered: HashMap::new(),
            private: Vec::new(),
            free_private: Vec::new(),
        }
    }

    /// Registers `memory` with the driver and maps `space` to its device address.
    pub fn map(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), CudaError> {
        self.unmap(space);
        let bytes = memory.stride_bytes() * memory.page_count();
        if bytes == 0 {
            self.table.insert(space, 0, memory.stride_bytes(), 0);
            return Ok(());
        }
        self.dev.context().bind_to_thread().map_err(driver)?;
        let host = memory.base().as_ptr().cast::<std::ffi::c_void>();
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        let mut device = 0u64;
        // SAFETY: `host..host + bytes` is mapped for as long as `memory` lives, and we hold
        // `memory` until the range is unregistered (unmap, drop).
        unsafe {
            sys::cuMemHostRegister_v2(host, bytes, flags).result().map_err(driver)?;
            if let Err(e) = sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0).result() {
                let _ = sys::cuMemHostUnregister(host);
                return Err(driver(e));
            }
        }
        self.table.insert(space, device, memory.stride_bytes(), memory.page_count());
        self.registered.insert(space, Registered { memory });
        tracing::info!(space, bytes, "page space registered with the GPU");
        Ok(())
    }

    pub fn unmap(&mut self, space: u32) {
        self.table.remove(space);
        if let Some(r) = self.registered.remove(&space) {
            let _ = self.dev.stream().synchronize();
            let _ = self.dev.context().bind_to_thread();
            // SAFETY: the range was registered by `map` and no queued work uses it any more.
            unsafe {
                let _ = sys::cuMemHostUnregister(r.memory.base().as_ptr().cast());
            }
        }
    }

    /// The device address of each page.
    pub fn addresses(&self, ids: &[PageId]) -> Result<Vec<u64>, CudaError> {
        ids.iter()
            .map(|id| {
                if id.space == PRIVATE_SPACE {
                    return self
                        .private
                        .get(id.index as usize)
                        .and_then(Option::as_ref)
                        .map(|p| p.device_ptr(self.dev.stream()).0)
                        .ok_or_else(|| CudaError::UnmappedPage(format!("{id:?}")));
                }
                self.table.address(*id).ok_or_else(|| CudaError::UnmappedPage(format!("{id:?}")))
            })
            .collect()
    }

    /// `n` zeroed device pages of `page_bytes`.
    pub fn private_pages(&mut self, page_bytes: usize, n: usize) -> Result<Vec<PageId>, CudaError> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let page = self.dev.stream().alloc_zeros::<u8>(page_bytes).map_err(driver)?;
            let index = match self.free_private.pop() {
                Some(i) => {
                    self.private[i as usize] = Some(page);
                    i
                }
                None => {
                    self.private.push(Some(page));
                    (self.private.len() - 1) as u32
                }
            };
            out.push(PageId::new(PRIVATE_SPACE, index));
        }
        Ok(out)
    }

    pub fn zero_private_pages(&self, page_bytes: usize, pages: &[PageId]) -> Result<(), CudaError> {
        self.dev.context().bind_to_thread().map_err(driver)?;
        for addr in self.addresses(pages)? {
            // SAFETY: a private page of `page_bytes` bytes.
            unsafe { result::memset_d8_async(addr, 0, page_bytes, self.dev.stream().cu_stream()) }.map_err(driver)?;
        }
        Ok(())
    }

    pub fn free_private_pages(&mut self, pages: &[PageId]) {
        for id in pages.iter().filter(|id| id.space == PRIVATE_SPACE) {
            if let Some(slot) = self.private.get_mut(id.index as usize)
                && slot.take().is_some()
            {
                self.free_private.push(id.index);
            }
        }
    }
}

impl Drop for PageSpaces {
    fn drop(&mut self) {
        let spaces: Vec<u32> = self.registered.keys().copied().collect();
        for s in spaces {
            self.unmap(s);
        }
    }
}
