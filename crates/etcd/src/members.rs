//! What the cluster's members say about themselves: one member's status (Maintenance.Status)
//! and the member list (Cluster.MemberList).

use crate::generated::etcdserverpb::{
    MemberListRequest, MemberListResponse, StatusRequest, StatusResponse,
};
use crate::{Client, Error};

impl Client {
    /// The status of the member that answers: its version, raft indices, and in `leader` the
    /// id of the member it takes for the leader (0 when it knows none).
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), modelmux_etcd::Error> {
    /// use modelmux_etcd::{Client, ConnectOptions};
    ///
    /// // One endpoint, so the status is that member's.
    /// let client = Client::connect(["http://127.0.0.1:2379"], ConnectOptions::new()).await?;
    /// let status = client.status().await?;
    /// let members = client.member_list().await?.members;
    /// let leader = members.iter().find(|m| m.id == status.leader);
    /// println!("led by {:?}", leader.map(|m| &m.name));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn status(&self) -> Result<StatusResponse, Error> {
        let maintenance = &self.maintenance;
        self.with_token(move || async move {
            Ok(maintenance
                .clone()
                .status(StatusRequest {})
                .await?
                .into_inner())
        })
        .await
    }

    /// Every member of the cluster: ids, names and URLs.
    pub async fn member_list(&self) -> Result<MemberListResponse, Error> {
        let (cluster, request) = (&self.cluster, &MemberListRequest::default());
        self.with_token(move || async move {
            Ok(cluster.clone().member_list(*request).await?.into_inner())
        })
        .await
    }
}
