//! The kinds of objects pods' volumes read, listed once: each kind is one
//! line of [`followed_kinds!`], which gives its [`Kind`] impl, its
//! [`ObjectKind`] and [`KubeObject`] variants, its name and scope (from
//! k8s-openapi's `Resource`), and its place in [`ObjectKind::visit`] (how a
//! source picks the typed code for a kind it learns at run time). Like
//! kube-runtime's `ObjectRef<K>`, an [`ObjectRef`] names one object of a
//! kind; [`decode`] is the one way from a JSON value to a typed object.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, Metadata, NamespaceResourceScope, Resource};
use serde::de::DeserializeOwned;

/// A kind of object pods' volumes read (one line of [`followed_kinds!`]).
pub trait Kind:
    Resource
    + Metadata<Ty = ObjectMeta>
    + DeserializeOwned
    + Clone
    + PartialEq
    + fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The kind as a value.
    const OBJECT_KIND: ObjectKind;
    /// The object as one of any kind.
    fn wrap(o: Arc<Self>) -> KubeObject;
    /// The object, if `o` is of this kind.
    fn of(o: &KubeObject) -> Option<&Arc<Self>>;
}

/// Whether a k8s-openapi scope is cluster-wide.
pub trait Scope {
    /// Objects live outside namespaces.
    const CLUSTER: bool;
}

impl Scope for ClusterResourceScope {
    const CLUSTER: bool = true;
}

impl Scope for NamespaceResourceScope {
    const CLUSTER: bool = false;
}

/// What a source does with a kind it learns at run time, typed: see
/// [`ObjectKind::visit`].
pub trait KindVisitor {
    /// What the visit gives.
    type Out;
    /// A namespaced kind.
    fn namespaced<K: Kind + Resource<Scope = NamespaceResourceScope>>(self) -> Self::Out;
    /// A cluster-scoped kind.
    fn cluster<K: Kind + Resource<Scope = ClusterResourceScope>>(self) -> Self::Out;
}

macro_rules! followed_kinds {
    ($( $(#[$doc:meta])* $variant:ident($ty:ty), $visit:ident; )*) => {
        /// The kinds of objects pods' volumes refer to.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ObjectKind {
            $( $(#[$doc])* $variant, )*
        }

        /// One object read from a source. `Debug` never prints Secret data.
        #[derive(Clone, PartialEq)]
        pub enum KubeObject {
            $( $(#[$doc])* $variant(Arc<$ty>), )*
        }

        $(
            impl Kind for $ty {
                const OBJECT_KIND: ObjectKind = ObjectKind::$variant;
                fn wrap(o: Arc<Self>) -> KubeObject {
                    KubeObject::$variant(o)
                }
                fn of(o: &KubeObject) -> Option<&Arc<Self>> {
                    match o {
                        KubeObject::$variant(x) => Some(x),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
            }
        )*

        impl ObjectKind {
            /// Every followed kind.
            pub const ALL: &[ObjectKind] = &[$( Self::$variant, )*];

            /// The kind's name, as in an object's `kind` field.
            pub fn name(self) -> &'static str {
                match self {
                    $( Self::$variant => <$ty as Resource>::KIND, )*
                }
            }

            /// The kind's collection in the API's paths (`persistentvolumes`).
            pub fn url_path_segment(self) -> &'static str {
                match self {
                    $( Self::$variant => <$ty as Resource>::URL_PATH_SEGMENT, )*
                }
            }

            /// Whether objects of the kind live outside namespaces.
            pub fn cluster_scoped(self) -> bool {
                match self {
                    $( Self::$variant => <<$ty as Resource>::Scope as Scope>::CLUSTER, )*
                }
            }

            /// Hands the kind's type to `v`.
            pub fn visit<V: KindVisitor>(self, v: V) -> V::Out {
                match self {
                    $( Self::$variant => v.$visit::<$ty>(), )*
                }
            }
        }

        impl KubeObject {
            /// The object's kind and metadata.
            fn parts(&self) -> (ObjectKind, &ObjectMeta) {
                match self {
                    $( Self::$variant(o) => (ObjectKind::$variant, o.metadata()), )*
                }
            }
        }
    };
}

followed_kinds! {
    /// `v1.PersistentVolume` (cluster-scoped).
    PersistentVolume(PersistentVolume), cluster;
    /// `v1.PersistentVolumeClaim`.
    PersistentVolumeClaim(PersistentVolumeClaim), namespaced;
    /// `v1.Secret`.
    Secret(Secret), namespaced;
    /// `v1.ConfigMap`.
    ConfigMap(ConfigMap), namespaced;
    /// `storage.k8s.io/v1.CSIDriver` (cluster-scoped).
    CsiDriver(CSIDriver), cluster;
    /// `storage.k8s.io/v1.VolumeAttachment` (cluster-scoped).
    VolumeAttachment(VolumeAttachment), cluster;
    /// `v1.Node` (cluster-scoped): this node, for local PVs' node affinity.
    Node(Node), cluster;
    /// `v1.ServiceAccount`: the account a pod's tokens are requested for
    /// (its UID: a replaced account gets fresh tokens at once).
    ServiceAccount(ServiceAccount), namespaced;
    /// `certificates.k8s.io.ClusterTrustBundle` (cluster-scoped; `v1`,
    /// `v1beta1` and `v1alpha1` read alike): projected trust anchors.
    ClusterTrustBundle(ClusterTrustBundle), cluster;
}

impl ObjectKind {
    /// Whether a source follows the kind whole (one list and watch of
    /// every object of it) rather than object by object: ClusterTrustBundles,
    /// public objects a node may list, selected by signer and labels.
    pub fn followed_whole(self) -> bool {
        self == Self::ClusterTrustBundle
    }

    /// The kind named `kind` (as in an object's `kind` field), if followed.
    pub fn from_name(kind: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.name() == kind)
    }

    /// The `apiVersion` of the kind's objects.
    pub fn api_version(self) -> &'static str {
        struct Version;
        impl KindVisitor for Version {
            type Out = &'static str;
            fn namespaced<K: Kind + Resource<Scope = NamespaceResourceScope>>(self) -> Self::Out {
                K::API_VERSION
            }
            fn cluster<K: Kind + Resource<Scope = ClusterResourceScope>>(self) -> Self::Out {
                K::API_VERSION
            }
        }
        self.visit(Version)
    }
}

/// Names one object (or, for [`ObjectRef::any`], every object of a kind).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// The kind.
    pub kind: ObjectKind,
    /// The namespace (empty for cluster-scoped kinds).
    pub namespace: String,
    /// The name (empty: any object of the kind).
    pub name: String,
}

impl ObjectRef {
    /// Object `namespace/name` of `kind` (the namespace is dropped for a
    /// cluster-scoped kind).
    pub fn new(kind: ObjectKind, namespace: &str, name: &str) -> Self {
        let namespace = if kind.cluster_scoped() {
            String::new()
        } else {
            namespace.to_string()
        };
        Self {
            kind,
            namespace,
            name: name.to_string(),
        }
    }

    /// Object `namespace/name` of kind `K`.
    pub fn of<K: Kind>(namespace: &str, name: &str) -> Self {
        Self::new(K::OBJECT_KIND, namespace, name)
    }

    /// Any PersistentVolume: what a claim without `spec.volumeName` depends
    /// on (the PV whose claimRef names it may appear anywhere).
    pub fn any_persistent_volume() -> Self {
        Self::any(ObjectKind::PersistentVolume)
    }

    /// Any object of `kind` (a change to one reaches the pods that read
    /// this): what a selection by other means than the name reads, e.g.
    /// ClusterTrustBundles by signer and labels.
    pub fn any(kind: ObjectKind) -> Self {
        Self::new(kind, "", "")
    }

    /// Whether this names every object of its kind.
    pub fn is_any(&self) -> bool {
        self.name.is_empty()
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind.name();
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

/// Why a JSON document is not an object pods' volumes can refer to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectDecodeError {
    /// A kind that is not followed (or no `kind`).
    #[error(
        "kind {0:?} is not followed (PersistentVolume, PersistentVolumeClaim, Secret, ConfigMap, CSIDriver, VolumeAttachment, Node, ServiceAccount and ClusterTrustBundle are)"
    )]
    UnsupportedKind(String),
    /// Not a valid object of its kind. For a Secret, the message never
    /// quotes the document (it could quote a value).
    #[error("not a valid v1.{kind}: {message}")]
    Invalid {
        /// The kind.
        kind: String,
        /// Why.
        message: String,
    },
    /// `metadata.name` is missing or empty.
    #[error("{0}: metadata.name is required")]
    NoName(String),
}

impl fmt::Debug for KubeObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KubeObject({})", self.reference())
    }
}

impl KubeObject {
    /// Decodes a JSON document by its `kind` (see [`decode`]).
    pub fn from_json(v: serde_json::Value) -> Result<Self, ObjectDecodeError> {
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        match ObjectKind::from_name(kind) {
            Some(k) => decode(k, v),
            None => Err(ObjectDecodeError::UnsupportedKind(kind.to_string())),
        }
    }

    /// The reference naming this object (namespace defaulted to `default`).
    pub fn reference(&self) -> ObjectRef {
        let (kind, meta) = self.parts();
        let ns = meta
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or("default");
        ObjectRef::new(kind, ns, meta.name.as_deref().unwrap_or(""))
    }

    /// The object, if of kind `K`.
    pub fn get<K: Kind>(&self) -> Option<&Arc<K>> {
        K::of(self)
    }
}

/// The one decoder of objects (the manifests directory, the API source,
/// the C ABI's `volmgr_object_upsert`): `v` as an object of `kind`, named.
/// A Secret's error never quotes the document (the parser's message could
/// quote a value); a ClusterTrustBundle of an older version reads as `v1`.
pub fn decode(kind: ObjectKind, v: serde_json::Value) -> Result<KubeObject, ObjectDecodeError> {
    struct Decode(serde_json::Value);
    impl Decode {
        fn typed<K: Kind>(self) -> Result<KubeObject, serde_json::Error> {
            serde_json::from_value::<K>(self.0).map(|o| K::wrap(Arc::new(o)))
        }
    }
    impl KindVisitor for Decode {
        type Out = Result<KubeObject, serde_json::Error>;
        fn namespaced<K: Kind + Resource<Scope = NamespaceResourceScope>>(self) -> Self::Out {
            self.typed::<K>()
        }
        fn cluster<K: Kind + Resource<Scope = ClusterResourceScope>>(self) -> Self::Out {
            self.typed::<K>()
        }
    }
    let v = match kind {
        ObjectKind::ClusterTrustBundle => as_v1_trust_bundle(v),
        _ => v,
    };
    let obj = kind
        .visit(Decode(v))
        .map_err(|e| ObjectDecodeError::Invalid {
            kind: kind.name().to_string(),
            message: match kind {
                ObjectKind::Secret => format!(
                    "details withheld, they could quote a secret value (line {}, column {})",
                    e.line(),
                    e.column()
                ),
                _ => e.to_string(),
            },
        })?;
    if obj.reference().name.is_empty() {
        return Err(ObjectDecodeError::NoName(kind.name().to_string()));
    }
    Ok(obj)
}

/// A ClusterTrustBundle of `certificates.k8s.io/v1beta1` or `v1alpha1`
/// read as `v1`: the three have the same fields (clusters before 1.37 serve
/// only the beta or alpha version).
pub fn as_v1_trust_bundle(mut v: serde_json::Value) -> serde_json::Value {
    const OLDER: [&str; 2] = [
        "certificates.k8s.io/v1beta1",
        "certificates.k8s.io/v1alpha1",
    ];
    if let Some(o) = v.as_object_mut() {
        if o.get("apiVersion")
            .and_then(|a| a.as_str())
            .is_some_and(|a| OLDER.contains(&a))
        {
            o.insert("apiVersion".into(), "certificates.k8s.io/v1".into());
        }
    }
    v
}
