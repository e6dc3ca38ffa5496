//! Certificates made for a test: a CA, and leaf certificates with the
//! names a test needs, as PEM files in a folder.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A CA whose certificate is `dir/ca.pem`, signing leaves into `dir`.
pub(crate) struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// The names a leaf certificate carries.
pub(crate) struct Names<'a> {
    /// Subject alternative names.
    pub(crate) sans: Vec<SanType>,
    /// The subject common name, if any.
    pub(crate) common_name: Option<&'a str>,
}

impl Names<'_> {
    /// A DNS name, which is also the common name.
    pub(crate) fn dns(name: &str) -> Names<'_> {
        Names {
            sans: vec![SanType::DnsName(name.try_into().expect("a DNS name"))],
            common_name: Some(name),
        }
    }

    /// A URI (a SPIFFE ID, say) and nothing else.
    pub(crate) fn uri(uri: &str) -> Names<'static> {
        Names {
            sans: vec![SanType::URI(uri.try_into().expect("a URI"))],
            common_name: None,
        }
    }

    /// A common name and no subject alternative name.
    pub(crate) fn common_name(name: &str) -> Names<'_> {
        Names {
            sans: Vec::new(),
            common_name: Some(name),
        }
    }
}

impl Pki {
    /// A new CA, written to `dir/ca.pem`.
    pub(crate) fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).expect("PKI dir");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(DnType::CommonName, "quotad test CA");
        let ca =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write the CA");
        Pki {
            dir: dir.to_owned(),
            ca,
        }
    }

    /// The CA certificate's file.
    pub(crate) fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A server certificate for `localhost`: (`server.pem`, `server.key`).
    pub(crate) fn server(&self) -> (PathBuf, PathBuf) {
        self.leaf(
            "server",
            Names::dns("localhost"),
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate with `names`: (`{file}.pem`, `{file}.key`).
    pub(crate) fn client(&self, file: &str, names: Names<'_>) -> (PathBuf, PathBuf) {
        self.leaf(file, names, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(
        &self,
        file: &str,
        names: Names<'_>,
        purpose: ExtendedKeyUsagePurpose,
    ) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
        params.subject_alt_names = names.sans;
        if let Some(name) = names.common_name {
            params.distinguished_name.push(DnType::CommonName, name);
        }
        params.extended_key_usages = vec![purpose];
        let cert = params.signed_by(&key, &self.ca).expect("leaf certificate");
        let (cert_path, key_path) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write the certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write the key");
        (cert_path, key_path)
    }
}
