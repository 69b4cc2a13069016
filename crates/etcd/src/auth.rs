//! etcd's user/password authentication, as etcd's own clients do it: the client asks etcd for a
//! token (Auth.Authenticate) before its first call, sends it as the `token` metadata of every
//! call, and asks for a new one when etcd answers that the token is no longer valid (it expired,
//! or the auth store changed since), then makes the call again, once. Also the few Auth calls
//! that turn authentication on (users, roles, permissions), for setting up an etcd.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use parking_lot::RwLock;

use tonic::Code;
use tonic::metadata::AsciiMetadataValue;

use crate::client::Transport;
use crate::generated::authpb::{Permission, permission};
use crate::generated::etcdserverpb::auth_client::AuthClient;
use crate::generated::etcdserverpb::{
    AuthEnableRequest, AuthEnableResponse, AuthRoleAddRequest, AuthRoleAddResponse,
    AuthRoleGrantPermissionRequest, AuthRoleGrantPermissionResponse, AuthUserAddRequest,
    AuthUserAddResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse, AuthenticateRequest,
};
use crate::kv::prefix_range;
use crate::{Client, Error};

/// etcd's answer to a call whose token it no longer takes (`ErrGRPCInvalidAuthToken`, code
/// `Unauthenticated`): expired, or issued by a member that restarted since.
const INVALID_TOKEN: &str = "invalid auth token";
/// etcd's answer to a call whose token predates a change of users or roles
/// (`ErrGRPCAuthOldRevision`).
const OLD_REVISION: &str = "revision of auth store is old";
/// What a watch refused for want of a valid token may say: etcd cancels it (no status) with a
/// reason, "permission denied" in some versions, the invalid token's message in others (3.4.23).
const PERMISSION_DENIED: &str = "permission denied";

/// A user and password to authenticate to etcd with. The password is never shown: not in
/// debug output, not in errors.
#[derive(Clone)]
pub struct Credentials {
    user: String,
    password: Arc<str>,
}

impl Credentials {
    /// `user` with `password` (etcd's `etcdctl user add`).
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: password.into().into(),
        }
    }

    /// The user.
    pub fn user(&self) -> &str {
        &self.user
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The token the calls of one client carry, shared with its [`CallMetadata`] interceptor.
pub(crate) type TokenSlot = RwLock<Option<Token>>;

/// A token etcd issued, and which one it is (the count of tokens this client was issued).
#[derive(Clone)]
pub(crate) struct Token {
    pub(crate) generation: u64,
    pub(crate) value: AsciiMetadataValue,
}

/// One client's authentication: its credentials and current token.
pub(crate) struct Auth {
    credentials: Credentials,
    slot: Arc<TokenSlot>,
    /// An Auth client whose calls carry no token (Authenticate needs none).
    client: AuthClient<Transport>,
    /// Held while a token is asked for, so that calls that all found theirs expired ask once.
    asking: tokio::sync::Mutex<()>,
}

impl Auth {
    pub(crate) fn new(
        credentials: Credentials,
        slot: Arc<TokenSlot>,
        client: AuthClient<Transport>,
    ) -> Self {
        Self {
            credentials,
            slot,
            client,
            asking: tokio::sync::Mutex::new(()),
        }
    }

    fn generation(&self) -> Option<u64> {
        let slot = self.slot.read();
        slot.as_ref().map(|t| t.generation)
    }

    /// The generation of the token calls carry now, asking etcd for one if there is none.
    async fn ensure(&self) -> Result<u64, Error> {
        if let Some(generation) = self.generation() {
            return Ok(generation);
        }
        self.renew(None).await
    }

    /// Asks etcd for a new token unless the one of generation `stale` (`None`: none) was
    /// replaced meanwhile; returns the generation calls carry then.
    async fn renew(&self, stale: Option<u64>) -> Result<u64, Error> {
        let _asking = self.asking.lock().await;
        let current = self.generation();
        if current.is_some() && current != stale {
            return Ok(current.unwrap_or_default());
        }
        let request = AuthenticateRequest {
            name: self.credentials.user.clone(),
            password: self.credentials.password.to_string(),
        };
        let reply = match self.client.clone().authenticate(request).await {
            Ok(reply) => reply.into_inner(),
            // etcd's own refusals: a wrong user or password, auth not enabled.
            Err(status)
                if matches!(
                    status.code(),
                    Code::InvalidArgument
                        | Code::FailedPrecondition
                        | Code::Unauthenticated
                        | Code::PermissionDenied
                ) =>
            {
                return Err(Error::Authentication {
                    user: self.credentials.user.clone(),
                    status,
                });
            }
            // etcd could not be reached, or refused the connection (TLS): the caller's usual
            // handling applies.
            Err(status) => return Err(status.into()),
        };
        let mut value =
            AsciiMetadataValue::try_from(reply.token).map_err(|_| Error::Authentication {
                user: self.credentials.user.clone(),
                status: tonic::Status::internal("etcd issued a token that is not ASCII"),
            })?;
        value.set_sensitive(true);
        let generation = current.map_or(1, |g| g + 1);
        *self.slot.write() = Some(Token { generation, value });
        Ok(generation)
    }
}

/// Whether `error` may only mean that the token the call carried is no longer valid.
fn token_may_be_stale(error: &Error) -> bool {
    match error {
        Error::Status(status) => {
            let message = status.message();
            (status.code() == Code::Unauthenticated && message.contains(INVALID_TOKEN))
                || message.contains(OLD_REVISION)
        }
        Error::WatchRefused { reason } => {
            reason.contains(INVALID_TOKEN)
                || reason.contains(OLD_REVISION)
                || reason.contains(PERMISSION_DENIED)
        }
        _ => false,
    }
}

impl Client {
    /// Runs `attempt` with a valid token (none without credentials), and once more with a new
    /// one if etcd said that the token it carried is no longer valid.
    pub(crate) async fn with_token<T, F, Fut>(&self, attempt: F) -> Result<T, Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let Some(auth) = &self.auth else {
            return attempt().await.map_err(|e| self.explain(e));
        };
        let result = async {
            let seen = auth.ensure().await?;
            match attempt().await {
                Err(e) if token_may_be_stale(&e) => {
                    auth.renew(Some(seen)).await?;
                    attempt().await
                }
                other => other,
            }
        };
        result.await.map_err(|e| self.explain(e))
    }

    /// Turns authentication on (etcd's `auth enable`): from then on every call needs a user's
    /// token, or a client certificate naming a user. etcd refuses unless user `root` exists
    /// with role `root`.
    pub async fn auth_enable(&self) -> Result<AuthEnableResponse, Error> {
        let auth = self.auth_admin.clone();
        self.with_token(|| {
            let mut auth = auth.clone();
            async move { Ok(auth.auth_enable(AuthEnableRequest {}).await?.into_inner()) }
        })
        .await
    }

    /// Adds user `name` with `password`.
    pub async fn user_add(&self, name: &str, password: &str) -> Result<AuthUserAddResponse, Error> {
        let request = AuthUserAddRequest {
            name: name.to_owned(),
            password: password.to_owned(),
            ..AuthUserAddRequest::default()
        };
        let (auth, request) = (&self.auth_admin, &request);
        self.with_token(move || async move {
            Ok(auth.clone().user_add(request.clone()).await?.into_inner())
        })
        .await
    }

    /// Adds role `name` (`root` is the role that may do everything).
    pub async fn role_add(&self, name: &str) -> Result<AuthRoleAddResponse, Error> {
        let request = AuthRoleAddRequest {
            name: name.to_owned(),
        };
        let (auth, request) = (&self.auth_admin, &request);
        self.with_token(move || async move {
            Ok(auth.clone().role_add(request.clone()).await?.into_inner())
        })
        .await
    }

    /// Grants role `role` to user `user`.
    pub async fn user_grant_role(
        &self,
        user: &str,
        role: &str,
    ) -> Result<AuthUserGrantRoleResponse, Error> {
        let request = AuthUserGrantRoleRequest {
            user: user.to_owned(),
            role: role.to_owned(),
        };
        let (auth, request) = (&self.auth_admin, &request);
        self.with_token(move || async move {
            Ok(auth
                .clone()
                .user_grant_role(request.clone())
                .await?
                .into_inner())
        })
        .await
    }

    /// Lets role `role` read and write every key that starts with `prefix`.
    pub async fn role_grant_prefix(
        &self,
        role: &str,
        prefix: impl Into<Vec<u8>>,
    ) -> Result<AuthRoleGrantPermissionResponse, Error> {
        let (key, range_end) = prefix_range(prefix.into());
        let request = AuthRoleGrantPermissionRequest {
            name: role.to_owned(),
            perm: Some(Permission {
                perm_type: permission::Type::Readwrite.into(),
                key,
                range_end,
            }),
        };
        let (auth, request) = (&self.auth_admin, &request);
        self.with_token(move || async move {
            Ok(auth
                .clone()
                .role_grant_permission(request.clone())
                .await?
                .into_inner())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_etcds_stale_token_answers_ask_for_a_new_token() {
        let stale = |status: tonic::Status| token_may_be_stale(&Error::from(status));
        assert!(stale(tonic::Status::unauthenticated(
            "etcdserver: invalid auth token"
        )));
        assert!(stale(tonic::Status::invalid_argument(
            "etcdserver: revision of auth store is old"
        )));
        for reason in [
            "etcdserver: permission denied",
            "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token",
        ] {
            let refused = Error::WatchRefused {
                reason: reason.into(),
            };
            assert!(token_may_be_stale(&refused), "{reason}");
        }
        assert!(!stale(tonic::Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password"
        )));
        assert!(!stale(tonic::Status::permission_denied(
            "etcdserver: permission denied"
        )));
        assert!(!stale(tonic::Status::unavailable("tcp connect error")));
    }

    #[test]
    fn the_password_is_never_shown() {
        let credentials = Credentials::new("modelmux", "hunter2");
        let shown = format!("{credentials:?}");
        assert!(
            shown.contains("modelmux") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert_eq!(credentials.user(), "modelmux");
    }
}
