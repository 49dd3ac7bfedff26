//! One captured call ([`Graph`]): its capture on the stream's private capture stream, its
//! replay on the stream (device inputs, or pinned host buffers for host-to-host graphs), and
//! its end, which waits for the last replay and gives its pool back.

use std::collections::VecDeque;

use super::pool::{with_hook, Hook, Pool};
use crate::backend::{BackendGraph, BackendPinned, DevicePtr};
use crate::dtype::{as_bytes, as_bytes_mut};
use crate::kernel::{Kernel, Strided, StridedCopy};
use crate::shape::{contiguous_strides, Dims};
use crate::storage::Storage;
use crate::sync::Mutex;
use crate::sync::{AtomicBool, Ordering};
use crate::tensor::ZerosLike;
use crate::tensor::{launch_on, OutSpec};
use crate::{DType, Element, Error, Result, Stream, StreamGuard, Tensor};

/// A static buffer of a graph: where it lives and the view of it.
struct StaticView {
    ptr: DevicePtr,
    shape: Vec<usize>,
    strides: Vec<usize>,
    dtype: DType,
}

/// One captured call: replayable on the stream it belongs to.
pub(super) struct Graph {
    stream: Stream,
    exec: Option<Box<dyn BackendGraph>>,
    inputs: Vec<StaticView>,
    outputs: Vec<StaticView>,
    /// Its memory: the static inputs and every allocation of the capture, given back on drop.
    pool: Pool,
    /// Tensors the graph's kernels read (weights, outputs that are not pool memory).
    keep: Vec<Tensor>,
    /// Orders copy-in, launch and copy-out among threads sharing the stream.
    replay_lock: Mutex<()>,
    /// For host-to-host graphs ([`super::GraphCache::run_host`]): the pinned buffers the graph's
    /// first and last nodes copy from and to.
    host: Option<HostIo>,
}

impl Graph {
    /// Bytes its pool holds.
    pub(super) fn pool_bytes(&self) -> usize {
        self.pool.bytes()
    }
}

/// Pinned input and output buffers of a host-to-host graph, with the flag that gives them to
/// one call at a time.
struct HostIo {
    inputs: Vec<(Box<dyn BackendPinned>, usize)>,
    outputs: Vec<(Box<dyn BackendPinned>, usize)>,
    /// Set while a call owns the buffers (from writing the inputs to reading the outputs).
    /// Never waited on: a call that finds it set runs eagerly instead. Left set for good
    /// after a failed wait, when the buffers can no longer be proven idle.
    busy: AtomicBool,
}

impl Graph {
    pub(super) fn capture<F, E>(
        stream: &Stream,
        sizes: &[usize],
        inputs: &[&Tensor],
        host_out: Option<&[usize]>,
        f: &F,
    ) -> Result<Graph>
    where
        F: Fn(&[Tensor]) -> std::result::Result<Vec<Tensor>, E>,
        E: std::fmt::Display,
    {
        let device = stream.device().clone();
        let side = stream
            .inner
            .capture_stream()?
            .ok_or_else(|| Error::Unavailable("graphs: not on this backend".into()))?;
        // Inputs' and weights' writers must be known complete before capture: a wait on
        // another stream's event cannot be captured. One host wait per capture.
        for t in inputs {
            t.storage().prepare_use(stream)?;
        }
        stream.inner.record(false)?.synchronize()?;
        let mut graph = Graph {
            stream: stream.clone(),
            exec: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            pool: Pool::default(),
            keep: Vec::new(),
            replay_lock: Mutex::new(()),
            host: None,
        };
        // From here on, `graph`'s drop gives back whatever the pool holds.
        let capture_stream = Stream::new(device.clone(), stream.index(), side.clone());
        let mut statics = Vec::with_capacity(inputs.len());
        for t in inputs {
            let bytes = t.elem_count().max(1) * t.dtype().size();
            let block = graph.pool.take(stream, bytes)?;
            let ptr = block.ptr;
            let storage = Storage::new(device.clone(), block, &capture_stream, None).graph_owned();
            statics.push(Tensor::from_storage(
                storage,
                Dims::from_slice(t.dims()),
                t.dtype(),
            ));
            graph.inputs.push(StaticView {
                ptr,
                shape: t.dims().to_vec(),
                strides: contiguous_strides(t.dims()),
                dtype: t.dtype(),
            });
        }
        let mut blocks = VecDeque::with_capacity(sizes.len());
        for &bytes in sizes {
            let block = graph.pool.take(stream, bytes)?;
            blocks.push_back((block.ptr, block.size));
        }
        let hook = Hook::Capture {
            device: device.id(),
            blocks,
            keep: Vec::new(),
        };
        // Pinned buffers are allocated before the capture (inside it that would be an error),
        // outputs in the sizes the traced eager run returned.
        let host = match host_out {
            Some(out_bytes) => {
                let mut io = HostIo {
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    busy: AtomicBool::new(false),
                };
                for st in &graph.inputs {
                    let bytes = st.shape.iter().product::<usize>() * st.dtype.size();
                    io.inputs.push((side.alloc_pinned(bytes)?, bytes));
                }
                for &bytes in out_bytes {
                    io.outputs.push((side.alloc_pinned(bytes)?, bytes));
                }
                Some(io)
            }
            None => None,
        };
        let mut outs = Vec::new();
        let (exec, hook) = with_hook(hook, || {
            let _on_side = StreamGuard::new(&capture_stream);
            side.capture(&mut || {
                if let Some(io) = &host {
                    for ((pinned, bytes), st) in io.inputs.iter().zip(&graph.inputs) {
                        // SAFETY: the static input holds `bytes`; the pinned buffer is written
                        // by a call only while it owns the graph (`HostIo::busy`).
                        unsafe { side.copy_pinned_to_device(pinned.as_ref(), st.ptr, *bytes)? };
                    }
                }
                outs = f(&statics).map_err(|e| {
                    Error::InvalidArgument(format!("graph capture: the closure failed: {e}"))
                })?;
                if let Some(io) = &host {
                    if io.outputs.len() != outs.len() {
                        return Err(Error::InvalidArgument(
                            "graph capture: outputs differ from the traced run".into(),
                        ));
                    }
                    for (o, (pinned, bytes)) in outs.iter_mut().zip(&io.outputs) {
                        // Host outputs are copied as one block (the trace did the same).
                        *o = o.contiguous()?;
                        if o.elem_count() * o.dtype().size() != *bytes {
                            return Err(Error::InvalidArgument(
                                "graph capture: output sizes differ from the traced run".into(),
                            ));
                        }
                        // SAFETY: `o` holds `bytes` and is kept by the graph; the pinned buffer
                        // is read only after the replay's event has completed.
                        unsafe { side.copy_device_to_pinned(o.ptr(), pinned.as_ref(), *bytes)? };
                    }
                }
                Ok(())
            })
        });
        graph.host = host;
        if let Hook::Capture { keep, .. } = hook {
            graph.keep = keep;
        }
        graph.exec = Some(exec?);
        for o in outs {
            if !o.device().same(&device) {
                return Err(Error::InvalidArgument(
                    "graph capture: an output on another device".into(),
                ));
            }
            graph.outputs.push(StaticView {
                ptr: o.ptr(),
                shape: o.dims().to_vec(),
                strides: o.layout().strides.to_vec(),
                dtype: o.dtype(),
            });
            graph.keep.push(o);
        }
        graph.keep.extend(statics);
        Ok(graph)
    }

    pub(super) fn replay(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let exec = self.exec.as_deref().ok_or_else(|| Error::Backend {
            device: self.stream.device().name(),
            msg: "graph without an executable".into(),
        })?;
        // Held while the copies and the launch are queued (no wait): another thread on this
        // stream must not overwrite the static inputs between our copy-in and launch.
        let _queued_together = self.replay_lock.lock();
        for (t, st) in inputs.iter().zip(&self.inputs) {
            t.storage().prepare_use(&self.stream)?;
            let copy = Kernel::Copy(StridedCopy {
                src: Strided {
                    ptr: t.ptr(),
                    strides: t.layout().strides.clone(),
                },
                shape: Dims::from_slice(&st.shape),
                out: st.ptr,
                elem_size: st.dtype.size(),
            });
            // SAFETY: `t` is alive and was prepared on this stream (its free guards cover the
            // read); the static input is pool memory of the right size, held by the graph.
            unsafe { self.stream.inner.launch(copy)? };
        }
        // SAFETY: every address the graph touches is pool memory or a kept tensor, alive as
        // long as the graph, and only this stream (in order) uses the pool.
        unsafe { self.stream.inner.launch_graph(exec)? };
        let mut outs = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            let spec = OutSpec {
                shape: Dims::from_slice(&o.shape),
                dtype: o.dtype,
            };
            let (ptr, strides, shape, elem_size) = (
                o.ptr,
                Dims::from_slice(&o.strides),
                Dims::from_slice(&o.shape),
                o.dtype.size(),
            );
            let out = launch_on(&self.stream, &[], spec, |p| {
                Kernel::Copy(StridedCopy {
                    src: Strided { ptr, strides },
                    shape,
                    out: p,
                    elem_size,
                })
            })?;
            outs.push(out);
        }
        Ok(outs)
    }
}

impl Graph {
    /// One host-to-host replay; `None` when another call owns the graph's buffers.
    pub(super) fn replay_host<T: Element>(
        &self,
        inputs: &[(&[T], &[usize])],
    ) -> Result<Option<Vec<Vec<T>>>> {
        let (Some(io), Some(exec)) = (&self.host, self.exec.as_deref()) else {
            return Err(Error::InvalidArgument("graph: not a host graph".into()));
        };
        if self.outputs.iter().any(|o| o.dtype != T::DTYPE) || inputs.len() != io.inputs.len() {
            return Err(Error::InvalidArgument(
                "graph: inputs or outputs of another type".into(),
            ));
        }
        // Acquire pairs with the Release below: the last owner's reads are done.
        if io
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Ok(None);
        }
        for ((pinned, bytes), (data, _)) in io.inputs.iter().zip(inputs) {
            let src = as_bytes(data);
            if src.len() != *bytes {
                io.busy.store(false, Ordering::Release);
                return Err(Error::InvalidArgument(
                    "graph: input of another size".into(),
                ));
            }
            // SAFETY: the pinned buffer holds `bytes`; we own it (busy flag), and the previous
            // replay that read it has completed (its owner waited before releasing the flag).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), pinned.ptr(), *bytes) };
        }
        // SAFETY: the graph's memory is its pool, kept tensors and its pinned buffers, all
        // alive as long as the graph; only this stream, in order, uses them.
        let done = unsafe { self.stream.inner.launch_graph(exec) }
            .and_then(|()| self.stream.inner.record(false))
            .and_then(|e| e.synchronize());
        // On error the buffers may still be in use: the flag stays set (graph retired).
        done?;
        let outs = io
            .outputs
            .iter()
            .map(|(pinned, bytes)| {
                let mut v = vec![T::zeros_like(); bytes / T::DTYPE.size()];
                // SAFETY: the replay's copy into the pinned buffer has completed (event above).
                let src = unsafe { std::slice::from_raw_parts(pinned.ptr() as *const u8, *bytes) };
                as_bytes_mut(&mut v).copy_from_slice(src);
                v
            })
            .collect();
        io.busy.store(false, Ordering::Release);
        Ok(Some(outs))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Wait for the last replay before destroying the executable graph and giving the pool
        // back. Dropping happens at eviction or when the cache goes, never under its lock.
        let idle = self
            .stream
            .inner
            .record(false)
            .and_then(|e| e.synchronize());
        if let Err(e) = idle {
            tracing::error!(error = %e, "graph: could not wait for its last replay; leaking its pool");
            std::mem::forget(self.exec.take());
            return;
        }
        self.exec = None;
        self.pool.give_back(&self.stream);
    }
}
