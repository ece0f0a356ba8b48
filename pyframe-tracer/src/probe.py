# stallscope Python probe. Injected into a live CPython (3.10+) by stallscope; runs at a safe point on the
# main thread, holding the GIL. It times watched functions and writes fixed-size records into a shared-memory
# ring that stallscope reads. It must never raise into the target: every entry point catches everything.
#
# Executed with globals {"__name__": "_stallscope_probe", "_REQUEST": <JSON text>, "_PAGE": (address, size) of
# the memory the request was written into, unmapped once it runs (address 0: none)}. The installed state lives
# in sys.modules["_stallscope_probe"], so a second injection finds and reuses it (idempotent attach).
#
# Layout of the ring file (must match pyframe-tracer/src/ring.rs):
#   header  @0:     magic u64, version u32, record_size u32, lanes u32, lane_capacity u32, heartbeat_ns u64 (@24),
#                   probe_state u64 (@32), records_offset u64 (@40), doorbell u32 (@48, a futex word),
#                   bell_probe u64 (@56: 1 + the watch whose records ring the doorbell, 0 none)
#   lanes   @256 + 64*lane: write_seq u64, read_seq u64, lost u64, owner tid u64
#   control @4096:  response_seq u64, response_len u32, pad u32, response JSON (<= 60 KiB)
#   records @records_offset + 128*(lane*lane_capacity + seq % lane_capacity):
#                   seq u64, probe u32, flags u32 (bit0 exception, bits 8..15 field present), tid u64,
#                   enter_ns u64, exit_ns u64, fields i64[8]
# The u64 words the reader polls (write_seq, lost, probe_state, response_seq) are stored through a
# memoryview cast to "Q": one aligned 8-byte store the reader sees whole. struct.pack_into zeroes
# its bytes before packing them (s_pack_internal, Modules/_struct.c), so a reader could see a
# write sequence of 0 between two records.
import sys
import os
import time
import json
import mmap
import struct
import itertools
import threading

PROBE_VERSION = 3
MODULE_NAME = "_stallscope_probe"
# The compiled writer (pyframe-native), loaded from the path stallscope offers and kept in sys.modules:
# CPython cannot unload an extension module, so a later attach reuses it. A loaded module of another version is
# left unused.
NATIVE_NAME = "_stallscope_native"
NATIVE_VERSION = 1
MAGIC = 0x31525043534C5453  # b"STLSCPR1" little-endian
HEADER = struct.Struct("<QIIQQQ")  # seq, probe, flags, tid, enter, exit
FIELDS = struct.Struct("<8q")  # written only when the record has extracted fields (flags bits 8..15)
DOORBELL = 48
LANE_BASE = 256
LANE_SIZE = 64
CONTROL = 4096
CONTROL_MAX = 65536 - CONTROL - 16
RECORD_SIZE = 128
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1

_mono = time.monotonic_ns
_get_ident = threading.get_ident
_get_native_id = threading.get_native_id


class _Ring:
    """The shared-memory ring, as the producer sees it. One lane per thread (single producer); threads beyond
    the exclusive lanes share the last lane through a non-blocking lock. The writer never blocks: a full lane
    or a busy shared lane counts a lost record."""

    def __init__(self, path):
        fd = os.open(path, os.O_RDWR)
        try:
            self.mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self.path = path
        self.view = memoryview(self.mm)
        self.q = self.view.cast("Q")
        magic, _version, record_size, lanes, cap = struct.unpack_from("<QIIII", self.mm, 0)
        if magic != MAGIC or record_size != RECORD_SIZE:
            raise ValueError("not a stallscope ring: %s" % path)
        self.lanes = lanes
        self.cap = cap
        self.records = self.q[5]
        self.lane_of = {}
        self.next_lane = itertools.count()
        self.shared_lock = threading.Lock()
        self.wseq = [0] * lanes
        self.lost = [0] * lanes
        for lane in range(lanes):
            self.wseq[lane] = self.q[(LANE_BASE + LANE_SIZE * lane) >> 3]
        self.bell = _doorbell(self.mm)

    def claim(self, ident):
        """Per-thread state: [lane, tid, write_seq, cached read_seq, shared, lane's word index, call stack].
        The call stack holds (code, probe id, extracted, t0) of the watched calls begun on this thread
        (sys.monitoring's PY_START; its PY_RETURN pops them)."""
        lane = next(self.next_lane)
        if lane >= self.lanes - 1:
            lane = self.lanes - 1
        tid = _get_native_id()
        shared = lane == self.lanes - 1
        word = (LANE_BASE + LANE_SIZE * lane) >> 3
        if not shared:
            self.q[word + 3] = tid
        state = self.lane_of[ident] = [lane, tid, self.wseq[lane], 0, shared, word, []]
        return state

    def writer(self):
        """The hot path as a closure over locals: write(st, probe, flags, t0, t1, v), st the calling thread's
        state (lane_of[get_ident()], or claim()), v 8 ints or None. Every watched call costs one Python call
        here: the callers look their thread's state up themselves, since they need it too."""
        mm = self.mm
        pack_header = HEADER.pack_into
        pack_fields = FIELDS.pack_into
        q = self.q
        cap = self.cap
        records = self.records
        shared_lock = self.shared_lock
        wseq = self.wseq
        lose = self._lose
        bell = self.bell

        def write(st, probe, flags, t0, t1, v):
            lane, tid, seq, rseq, shared, word, _ = st
            if shared:
                if not shared_lock.acquire(False):
                    lose(lane)
                    return
                seq = wseq[lane]
            try:
                if seq - rseq >= cap:
                    rseq = st[3] = q[word + 1]
                    if seq - rseq >= cap:
                        lose(lane)
                        return
                off = records + RECORD_SIZE * (lane * cap + seq % cap)
                pack_header(mm, off, seq, probe, flags, tid, t0, t1)
                if v is not None:
                    pack_fields(mm, off + 40, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])
                st[2] = seq + 1
                wseq[lane] = seq + 1
                q[word] = seq + 1
                if q[7] == probe + 1 and bell is not None:
                    # The doorbell changes after the write sequence (stores stay in order), so a
                    # reader that sees it changed sees the record too.
                    q[6] += 1
                    bell()
            finally:
                if shared:
                    shared_lock.release()
        return write

    def _lose(self, lane):
        self.lost[lane] += 1
        self.q[((LANE_BASE + LANE_SIZE * lane) >> 3) + 2] = self.lost[lane]

    def heartbeat(self):
        return self.q[3]

    def set_state(self, state):
        self.q[4] = state

    def respond(self, seq, obj):
        data = json.dumps(obj).encode()[:CONTROL_MAX]
        self.mm[CONTROL + 16:CONTROL + 16 + len(data)] = data
        struct.pack_into("<I", self.mm, CONTROL + 8, len(data))
        self.q[CONTROL >> 3] = seq

    def close(self):
        try:
            self.q.release()
            self.view.release()
            self.mm.close()
        except Exception:
            pass


def _doorbell(mm):
    """bell() waking whoever waits on the ring's doorbell word (FUTEX_WAKE, shared: the reader maps the same
    file), or None where the syscall is unknown or the target has not imported ctypes (the reader then finds
    records by polling). ctypes is not imported for this: its import leaves libffi's trampoline memfd open in
    the process for good (engines import it anyway: torch does)."""
    try:
        ctypes = sys.modules.get("ctypes")
        if ctypes is None:
            return None
        nr = {"x86_64": 202, "aarch64": 98}[os.uname().machine]
        word = ctypes.c_char.from_buffer(mm, DOORBELL)
        addr = ctypes.addressof(word)
        # The ctypes object holds an export of the mapping, which would keep mm.close() from unmapping it.
        del word
        syscall = ctypes.CDLL(None, use_errno=True).syscall
        syscall.restype = ctypes.c_long
        syscall.argtypes = (ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_int)

        def bell():
            syscall(nr, addr, 1, 0x7FFFFFFF, None, None, 0)  # FUTEX_WAKE every waiter
        return bell
    except Exception:
        return None


def _extractor(func_code, fields):
    """Builds f(args, kwargs) -> (mask, v0..v7) for the declared fields, or None when there are none.
    Each field is {"name", "param", "attrs": [...], "agg": "none"|"len"|"sum"}."""
    if not fields:
        return None
    nargs = func_code.co_argcount
    names = func_code.co_varnames
    plan = []
    for f in fields:
        param = f["param"]
        index = names.index(param) if param in names[:nargs] else -1
        plan.append((param, index, tuple(f["attrs"]), f["agg"]))

    def value(root, attrs, agg):
        v = root
        for a in attrs:
            v = getattr(v, a)
        if agg == "len":
            v = len(v)
        elif agg == "sum":
            if isinstance(v, dict):
                v = v.values()
            v = sum(v)
        v = int(v)
        if v < I64_MIN or v > I64_MAX:
            raise OverflowError
        return v

    def extract(args, kwargs):
        out = [0, 0, 0, 0, 0, 0, 0, 0]
        mask = 0
        for i, (param, index, attrs, agg) in enumerate(plan):
            try:
                if 0 <= index < len(args):
                    root = args[index]
                else:
                    root = kwargs[param]
                out[i] = value(root, attrs, agg)
                mask |= 1 << i
            except Exception:
                pass
        return mask, out

    return extract


class _Watch:
    """One watched function and how it was instrumented."""

    def __init__(self, probe_id, spec, owner, attr, raw, func, fields):
        self.id = probe_id
        self.spec = spec
        self.owner = owner
        self.attr = attr
        self.raw = raw
        self.func = func
        self.code = func.__code__
        self.fields = fields
        self.extract = _extractor(self.code, fields)
        self.mechanism = None


class _Probe:
    """The installed probe: ring, watched functions, instrumentation."""

    def __init__(self):
        self.ring = None
        self.write = None
        self.native = None
        self.native_note = None
        self.watches = []
        self.by_code = {}
        self.timing = None
        self.tool = None
        self.lease_ns = 30_000_000_000
        self.next_check = 0
        self.expire_pending = False

    # ---- records ---------------------------------------------------------------------------------------
    def emit(self, st, probe_id, t0, t1, exc, extracted):
        """Writes one record from the slow paths (an exception, extracted fields) and renews the lease
        check; st None: the calling thread's state is looked up here. The common path, a plain return
        without fields, is written inline by the hooks. Raises nothing (the probe may be detached by now)."""
        try:
            if self.native is not None:
                self.native.write(probe_id, exc, t0, t1, extracted)
                return
            if st is None:
                st = self.thread_state()
            if extracted is None:
                self.write(st, probe_id, exc, t0, t1, None)
            else:
                self.write(st, probe_id, exc | (extracted[0] << 8), t0, t1, extracted[1])
            if t1 >= self.next_check:
                self.check_lease(t1)
        except Exception:
            pass

    def thread_state(self):
        ring = self.ring
        st = ring.lane_of.get(_get_ident())
        return st if st is not None else ring.claim(_get_ident())

    def check_lease(self, now):
        self.next_check = now + 1_000_000_000
        beat = self.ring.heartbeat()
        if beat and now - beat > self.lease_ns and not self.expire_pending:
            # stallscope stopped reading (killed?): take everything out again.
            self.expire_pending = True
            self.detach()
            self.close_ring()

    # ---- instrumentation: __code__ swap (3.10, 3.11) ------------------------------------------------------
    def hook_for(self, watch, orig):
        if self.native is not None and watch.extract is None:
            return self.native.hook(orig, watch.id)
        emit = self.emit
        write = self.write
        pid = watch.id
        probe = self
        extract = watch.extract
        mono = _mono
        lane_of = self.ring.lane_of
        claim = self.ring.claim
        get_ident = _get_ident

        if extract is None:
            def hook(args, kwargs):
                t0 = mono()
                try:
                    r = orig(*args, **kwargs)
                except BaseException:
                    emit(None, pid, t0, mono(), 1, None)
                    raise
                t1 = mono()
                try:
                    st = lane_of.get(get_ident())
                    if st is None:
                        st = claim(get_ident())
                    write(st, pid, 0, t0, t1, None)
                    if t1 >= probe.next_check:
                        probe.check_lease(t1)
                except Exception:
                    pass
                return r
        else:
            def hook(args, kwargs):
                t0 = mono()
                try:
                    x = extract(args, kwargs)
                except Exception:
                    x = None
                try:
                    r = orig(*args, **kwargs)
                except BaseException:
                    emit(None, pid, t0, mono(), 1, x)
                    raise
                emit(None, pid, t0, mono(), 0, x)
                return r
        return hook

    def swap_code(self, watch):
        import types
        import warnings
        f = watch.func
        code = watch.code
        orig = types.FunctionType(code, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        orig.__kwdefaults__ = f.__kwdefaults__
        hook = self.hook_for(watch, orig)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tramp = compile("def _t(*args, **kwargs):\n return '__stallscope_hook__'(args, kwargs)\n",
                            code.co_filename, "exec")
        tcode = [c for c in tramp.co_consts if hasattr(c, "co_code")][0]
        consts = tuple(hook if (type(c) is str and c == "__stallscope_hook__") else c for c in tcode.co_consts)
        repl = {"co_consts": consts, "co_name": code.co_name, "co_firstlineno": code.co_firstlineno}
        if hasattr(code, "co_qualname"):
            repl["co_qualname"] = code.co_qualname
        f.__code__ = tcode.replace(**repl)
        watch.mechanism = "code-swap"

    # ---- instrumentation: wrapper in the owner's namespace (closures on 3.10/3.11) --------------------------
    def wrap_attr(self, watch):
        import functools
        hook = self.hook_for(watch, watch.func)

        @functools.wraps(watch.func)
        def wrapper(*args, **kwargs):
            return hook(args, kwargs)
        if isinstance(watch.raw, (staticmethod, classmethod)):
            wrapper = type(watch.raw)(wrapper)
        setattr(watch.owner, watch.attr, wrapper)
        watch.mechanism = "attr-wrap"

    # ---- instrumentation: sys.monitoring local events (3.12+) ----------------------------------------------
    def monitoring_start(self):
        mon = sys.monitoring
        for tool in (4, 3, 5, 2, 1, 0):
            try:
                mon.use_tool_id(tool, "stallscope")
            except ValueError:
                continue
            self.tool = tool
            break
        else:
            raise RuntimeError("all sys.monitoring tool ids are in use")
        E = mon.events
        if self.native is not None:
            n = self.native
            on_start, on_return, on_unwind = n.on_start, n.on_return, n.on_unwind
        else:
            on_start, on_return, on_unwind = self.monitoring_callbacks()
        mon.register_callback(self.tool, E.PY_START, on_start)
        mon.register_callback(self.tool, E.PY_RETURN, on_return)
        mon.register_callback(self.tool, E.PY_UNWIND, on_unwind)
        mon.set_events(self.tool, E.PY_UNWIND)

    def monitoring_callbacks(self):
        """PY_START, PY_RETURN and PY_UNWIND callbacks as closures over locals: each is one Python call per
        event plus the record's write (attribute lookups and nested calls are most of a watched call's cost).
        PY_START and PY_RETURN fire only for watched code objects (local events); PY_UNWIND for every frame an
        exception unwinds, so it tests the code object first."""
        by_code = self.by_code
        write = self.write
        emit = self.emit
        probe = self
        mono = _mono
        get_ident = _get_ident
        lane_of = self.ring.lane_of
        claim = self.ring.claim
        getframe = sys._getframe

        def on_start(code, offset):
            try:
                watch = by_code[code]
                x = None
                if watch.extract is not None:
                    try:
                        x = watch.extract((), getframe(1).f_locals)
                    except Exception:
                        x = None
                st = lane_of.get(get_ident())
                if st is None:
                    st = claim(get_ident())
                st[6].append((code, watch.id, x, mono()))
            except Exception:
                pass

        def ender(exc):
            """The PY_RETURN (exc 0) or PY_UNWIND (exc 1) callback: both take (code, offset, value)."""
            def on_end(code, offset, value):
                if exc and code not in by_code:
                    return
                t1 = mono()
                try:
                    st = lane_of[get_ident()]
                    stack = st[6]
                    while stack:
                        c, pid, x, t0 = stack.pop()
                        if c is code:
                            if x is None and not exc:
                                write(st, pid, 0, t0, t1, None)
                                if t1 >= probe.next_check:
                                    probe.check_lease(t1)
                            else:
                                emit(st, pid, t0, t1, exc, x)
                            return
                except Exception:
                    pass
            return on_end

        return on_start, ender(0), ender(1)

    def monitor(self, watch):
        mon = sys.monitoring
        if self.tool is None:
            self.monitoring_start()
        E = mon.events
        if self.native is not None:
            extract = None
            if watch.extract is not None:
                def extract(getframe=sys._getframe, x=watch.extract):
                    # Called by the native PY_START callback, which adds no frame: the watched
                    # call's frame is this one's caller.
                    try:
                        return x((), getframe(1).f_locals)
                    except Exception:
                        return None
            self.native.watch(watch.code, watch.id, extract)
        mon.set_local_events(self.tool, watch.code, E.PY_START | E.PY_RETURN)
        watch.mechanism = "sys.monitoring"

    # ---- watch / unwatch -----------------------------------------------------------------------------------
    def resolve(self, module_name, qualname):
        """(owner, attribute, function) for MODULE:QUALNAME, or raises LookupError with close matches."""
        import difflib
        import inspect
        module = sys.modules.get(module_name)
        if module is None:
            near = difflib.get_close_matches(module_name, list(sys.modules), n=3)
            raise LookupError("module %s is not imported in the target%s" % (
                module_name, "; close matches: " + ", ".join(near) if near else ""))
        owner = module
        parts = qualname.split(".")
        for i, part in enumerate(parts):
            try:
                value = inspect.getattr_static(owner, part)
            except AttributeError:
                names = [n for n in dir(owner) if not n.startswith("__")]
                near = difflib.get_close_matches(part, names, n=3)
                where = "%s:%s" % (module_name, ".".join(parts[:i]) or "<module>")
                raise LookupError("function %s:%s not found: %s has no attribute %r%s" % (
                    module_name, qualname, where, part,
                    "; close matches: " + ", ".join(near) if near else ""))
            if i < len(parts) - 1:
                owner = value
        raw = value
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        func = value
        if not hasattr(func, "__code__"):
            raise LookupError("%s:%s is a %s, not a Python function" % (module_name, qualname, type(value).__name__))
        named = [p for p in parts if p != "__wrapped__"][-1]
        if hasattr(func, "__wrapped__") and func.__code__.co_name != named:
            # A decorator's wrapper: its code object is shared by everything it wraps.
            raise LookupError("%s:%s is wrapped by a decorator (its code is %s); watch %s:%s.__wrapped__ to time "
                              "the function itself" % (module_name, qualname, func.__code__.co_name, module_name,
                                                       qualname))
        if func.__code__.co_flags & (0x20 | 0x80 | 0x200):
            raise LookupError("%s:%s is a generator or coroutine; stallscope times plain functions only" % (
                module_name, qualname))
        return owner, parts[-1], raw, func

    def watch(self, spec):
        module_name, qualname = spec["module"], spec["qualname"]
        owner, attr, raw, func = self.resolve(module_name, qualname)
        for w in self.watches:
            if w.func is func or (w.owner is owner and w.attr == attr):
                return w, False
        fields = spec.get("fields", [])
        for f in fields:
            params = func.__code__.co_varnames[:func.__code__.co_argcount + func.__code__.co_kwonlyargcount]
            if f["param"] not in params:
                raise LookupError("%s:%s has no parameter %r for field %r (parameters: %s)" % (
                    module_name, qualname, f["param"], f["name"], ", ".join(params)))
        watch = _Watch(len(self.watches), spec["text"], owner, attr, raw, func, fields)
        if self.timing == "sys.monitoring":
            self.by_code[watch.code] = watch
            self.monitor(watch)
        elif func.__code__.co_freevars:
            self.wrap_attr(watch)
        else:
            self.swap_code(watch)
        self.watches.append(watch)
        return watch, True

    def unwatch_all(self):
        errors = []
        for w in reversed(self.watches):
            try:
                if w.mechanism == "code-swap":
                    w.func.__code__ = w.code
                elif w.mechanism == "attr-wrap":
                    setattr(w.owner, w.attr, w.raw)
                elif w.mechanism == "sys.monitoring":
                    sys.monitoring.set_local_events(self.tool, w.code, 0)
            except Exception as e:
                errors.append("%s: %s" % (w.spec, e))
        self.watches = []
        self.by_code.clear()
        if self.native is not None:
            self.native.unwatch_all()
        if self.ring is not None:
            for st in list(self.ring.lane_of.values()):
                del st[6][:]
        if self.tool is not None:
            try:
                mon = sys.monitoring
                E = mon.events
                mon.set_events(self.tool, 0)
                for ev in (E.PY_START, E.PY_RETURN, E.PY_UNWIND):
                    mon.register_callback(self.tool, ev, None)
                mon.free_tool_id(self.tool)
            except Exception as e:
                errors.append("monitoring: %s" % e)
            self.tool = None
        return errors

    def detach(self):
        """Restores everything; the ring stays mapped until close_ring() so the answer can still be written."""
        errors = self.unwatch_all()
        if self.ring is not None:
            try:
                self.ring.set_state(2)
            except Exception:
                pass
        sys.modules.pop(MODULE_NAME, None)
        return errors

    def close_ring(self):
        if self.native is not None:
            self.native.close()
            self.native = None
        if self.ring is not None:
            self.ring.close()
            self.ring = None

    # ---- requests ------------------------------------------------------------------------------------------
    def detect(self, profiles):
        for p in profiles:
            if any(m in sys.modules for m in p.get("detect_modules", [])):
                return p
        return None

    def handle(self, req):
        op = req["op"]
        if op == "detach":
            return {"ok": True, "errors": self.detach()}
        if op == "status":
            return {"ok": True, "watches": [w.spec for w in self.watches]}
        # op == "attach"
        if self.ring is not None and self.ring.path != req["ring"] and self.watches:
            # Another session's probes are installed. While its lease is renewed that stallscope
            # is alive: one set of probes per process, so this attach is refused (once the lease
            # runs out the probes remove themselves and a new attach succeeds).
            beat = self.ring.heartbeat()
            age = _mono() - beat if beat else None
            if age is not None and age <= self.lease_ns:
                return {"ok": False, "busy": True, "retry_after_ns": max(0, self.lease_ns - age),
                        "error": "process %d is already watched by another stallscope (its probes' lease was "
                                 "renewed %.1f s ago and lasts %.0f s): stop that stallscope, or, if it was killed, "
                                 "attach again once its lease has run out" % (os.getpid(), age / 1e9, self.lease_ns / 1e9)}
        if self.ring is None or self.ring.path != req["ring"]:
            if self.ring is not None:
                self.unwatch_all()
                self.close_ring()
            self.ring = _Ring(req["ring"])
            self.write = self.ring.writer()
            self.native, self.native_note = _native_writer(req, self.check_lease)
        self.lease_ns = int(req.get("lease_ns", self.lease_ns))
        # How to time calls is decided by stallscope for this version (PythonRuntime::mechanisms).
        self.timing = req["timing"]
        self.expire_pending = False
        specs = list(req.get("specs", []))
        framework = None
        profile = self.detect(req.get("profiles", []))
        if profile is not None:
            framework = profile["name"]
            specs = [dict(s, optional=True) for s in profile["specs"]] + specs
        probes, warnings, errors = [], [], []
        for spec in specs:
            try:
                w, new = self.watch(spec)
                probes.append({"id": w.id, "spec": spec["text"], "mechanism": w.mechanism, "new": new,
                               "fields": [f["name"] for f in w.fields], "role": spec.get("role", "watch")})
            except Exception as e:
                (warnings if spec.get("optional") else errors).append(str(e))
        if errors:
            self.unwatch_all()
            return {"ok": False, "error": "; ".join(errors), "warnings": warnings}
        self.ring.set_state(1)
        return {"ok": True, "framework": framework, "probes": probes, "warnings": warnings,
                "writer": "native" if self.native is not None else "python", "writer_note": self.native_note,
                "python": "%d.%d.%d" % sys.version_info[:3], "pid": os.getpid()}


def _native_writer(req, lease):
    """(the compiled writer of the request's ring, None) or (None, why not). req["native"]: null, do not use
    one; "", the module this process already loaded; else the library stallscope put there (removed by
    stallscope after the attach), unless the module is loaded already."""
    path = req.get("native")
    if path is None:
        return None, "stallscope offered no compiled writer"
    module = sys.modules.get(NATIVE_NAME)
    try:
        if module is None:
            if not path:
                return None, "the compiled writer is not loaded in this process"
            import importlib.machinery
            import importlib.util
            loader = importlib.machinery.ExtensionFileLoader(NATIVE_NAME, path)
            spec = importlib.util.spec_from_loader(NATIVE_NAME, loader, origin=path)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            sys.modules[NATIVE_NAME] = module
        if getattr(module, "VERSION", None) != NATIVE_VERSION:
            return None, "the process holds %s version %s, this probe needs %d" % (
                NATIVE_NAME, getattr(module, "VERSION", None), NATIVE_VERSION)
        return module.Writer(req["ring"], lease), None
    except Exception as e:
        return None, "%s: %s" % (type(e).__name__, e)


def _free_page(addr, size):
    """Unmaps the page stallscope wrote this request into (the interpreter no longer needs it once compiled)."""
    if not addr:
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    except Exception:
        pass


def _main(text):
    req = json.loads(text)
    _free_page(*_PAGE)
    if req.get("script"):
        try:
            os.unlink(req["script"])
        except Exception:
            pass
    installed = sys.modules.get(MODULE_NAME)
    probe = getattr(installed, "probe", None)
    if probe is not None and getattr(installed, "PROBE_VERSION", None) != PROBE_VERSION:
        try:
            probe.detach()
        except Exception:
            pass
        probe = None
    if probe is None:
        if req["op"] != "attach":
            _respond_once(req, {"ok": True, "errors": [], "note": "no probe installed"})
            return
        import types
        module = types.ModuleType(MODULE_NAME)
        module.PROBE_VERSION = PROBE_VERSION
        module.probe = probe = _Probe()
        sys.modules[MODULE_NAME] = module
    try:
        resp = probe.handle(req)
    except Exception as e:
        resp = {"ok": False, "error": "probe failed: %s: %s" % (type(e).__name__, e)}
        if not probe.watches and probe.ring is None:
            sys.modules.pop(MODULE_NAME, None)
    if probe.ring is not None and probe.ring.path == req["ring"]:
        probe.ring.respond(req["seq"], resp)
    else:
        _respond_once(req, resp)
    if req["op"] == "detach":
        probe.close_ring()
    elif not resp.get("ok") and not probe.watches:
        # A refused first attach leaves nothing installed.
        probe.detach()
        probe.close_ring()


def _respond_once(req, resp):
    """Answers through the request's ring when the probe is not (or no longer) mapped to it."""
    try:
        ring = _Ring(req["ring"])
        ring.respond(req["seq"], resp)
        ring.close()
    except Exception:
        pass


try:
    _main(_REQUEST)
except KeyboardInterrupt:
    # The target's own Ctrl-C arrived while the probe ran: hand it back instead of swallowing it.
    try:
        import signal
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        pass
except BaseException:
    pass
